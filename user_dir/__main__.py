"""``python -m user_dir`` prints the plugin's folder, which fairseq's ``--user-dir`` needs.

fairseq imports a plugin from a folder given on the command line; with the package installed
(``pip install -e .`` or ``pip install .``), ``--user-dir "$(python -m user_dir)"`` works from any
directory, not only from the repository root.
"""
from pathlib import Path

print(Path(__file__).resolve().parent)
