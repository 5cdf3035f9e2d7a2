#!/usr/bin/env bash
# The mutation check of the wiring between the core and the front doors (docs/tests.md, "Mutation check"): mutmut
# mutates the modules pyproject.toml's [tool.mutmut] names, one change at a time (a flipped operator, another
# constant, a dropped argument), and runs the fast-tier tests that reach each mutated function; a mutant that no test
# fails "survives". mutmut works in mutants/: the project's tracked files are copied there first, so the tests find
# what they read and run. Arguments go to `mutmut run` (mutant names, or globs such as "user_dir.criterions*").
# It resumes: mutants with a result are not run again. Then `.venv/bin/mutmut results` lists the survivors and
# `.venv/bin/mutmut show NAME` shows one as a diff.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
.venv/bin/python -m pip install --quiet -r requirements/mutation.txt
mkdir -p mutants
git ls-files -z --cached --others --exclude-standard | tar --null --files-from=- -cf - | tar -xf - -C mutants
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/mutmut run "$@"
