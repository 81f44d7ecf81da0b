"""One adapter module per language or library. Each registers its implementations
(``harness.model.registry.register``) as it is imported, so the order of these imports, the
reading order, simplest first, is the order of every table."""

# isort: off
from harness.backends import python_loops, c, decode, numpy_blas, peers, ggml_peer, llama_cpp  # noqa: F401
from harness.backends import cuda, torch_gpu, torch_int4, triton_kernels  # noqa: F401
# isort: on
