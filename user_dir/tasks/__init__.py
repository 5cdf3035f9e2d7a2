"""Tasks registered by the plugin (fairseq imports this folder itself; we import it too for scripts)."""
from . import sparse_seq2seq, text_classification  # noqa: F401
