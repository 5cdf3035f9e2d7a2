"""Sparse-softmax and AS-Softmax for fairseq: ``--user-dir user_dir``, a thin shell over ``sparse_softmax``.

The math is in ``sparse_softmax`` (plain PyTorch, no fairseq). Importing this package registers the
criterions, models and tasks with fairseq and applies the fixes in ``fairseq_compat`` when fairseq is
installed (fairseq imports the user dir before it builds anything or loads a checkpoint).
"""
from importlib.util import find_spec

if find_spec("fairseq") is not None:
    from . import fairseq_compat

    fairseq_compat.apply()
    from . import criterions, models, tasks  # noqa: F401,E402
