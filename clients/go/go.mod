// Ladder's Go client: the stubs generated from proto/ladder/v1/ladder.proto (package ladder/v1)
// and an example program (cmd/ladder-go). The versions are the oldest tested (Debian 12's
// packages); `go mod tidy` writes go.sum (docs/clients.md, Go).
module github.com/ladder-serve/ladder/clients/go

go 1.19

require (
	google.golang.org/genproto v0.0.0-20200526211855-cb27e3aa2013
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
