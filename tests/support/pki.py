"""A throwaway PKI for TLS tests: a CA, a server certificate for 127.0.0.1/localhost and a client
certificate, made with the openssl command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed_pair(name: str, extensions: str, cwd: Path) -> None:
    """name.key and name.pem, an EC key and a certificate the test CA signed."""
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=cwd,
    )
    (cwd / f"{name}.ext").write_text(extensions + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        cwd=cwd,
    )


def make_pki(cwd: Path) -> Path:
    """ca.pem/ca.key, server.pem/server.key and client.pem/client.key in cwd (skips without openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=ladder-test-ca",
        cwd=cwd,
    )
    _signed_pair("server", "subjectAltName=IP:127.0.0.1,DNS:localhost", cwd)
    _signed_pair("client", "extendedKeyUsage=clientAuth", cwd)
    return cwd
