"""fairseq criterions: thin shells over ``user_dir.losses``."""
from . import as_softmax, baselines, sparse_softmax  # noqa: F401
