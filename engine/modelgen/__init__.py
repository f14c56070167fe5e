"""Building GroupQueryAttention decoders in the onnxruntime-genai layout.

`builder` turns a spec and weights into an ONNX graph and a model directory
(the same graph serves generated test models and converted real ones);
`synthetic` makes seeded random weights and the variant decoders the tests
need; `reference` is a numpy forward of the same arithmetic.
"""

from engine.modelgen.builder import (
    DecoderSpec,
    DecoderWeights,
    LayerWeights,
    build_decoder,
    genai_config,
    write_model_dir,
)

__all__ = [
    "DecoderSpec",
    "DecoderWeights",
    "LayerWeights",
    "build_decoder",
    "genai_config",
    "write_model_dir",
]
