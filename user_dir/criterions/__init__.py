"""fairseq criterions: thin shells over ``sparse_softmax.losses``."""
from . import as_softmax, baselines, sparse_softmax  # noqa: F401
