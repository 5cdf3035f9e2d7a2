"""Models registered by the plugin (fairseq imports this folder itself; we import it too for scripts)."""
from . import cosine_transformer, hf_encoder, hf_unilm, text_encoder  # noqa: F401
