"""Print the command-line options the plugin adds: ``python -m user_dir.help [NAME ...]``.

``fairseq-train --criterion X --help`` cannot show them: fairseq prints help during its first
argument pass, before it adds any criterion's, model's or task's options (true of fairseq's own
criterions too). This renders the same options through fairseq's own dataclass-to-argparse code.
"""
from __future__ import annotations

import argparse
import sys

from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import MODEL_DATACLASS_REGISTRY, MODEL_REGISTRY
from fairseq.tasks import TASK_DATACLASS_REGISTRY

import user_dir  # noqa: F401  (registers everything below)
from user_dir import criterions, models, tasks


def plugin_parsers() -> dict[str, argparse.ArgumentParser]:
    """One parser per plugin criterion / model / task, named as on the fairseq command line."""
    parsers = {}
    plugin = user_dir.__name__
    for name, dc in sorted(CRITERION_DATACLASS_REGISTRY.items()):
        if dc.__module__.startswith(criterions.__name__):
            parser = argparse.ArgumentParser(prog=f"--criterion {name}", add_help=False)
            gen_parser_from_dataclass(parser, dc())
            parsers[f"criterion {name}"] = parser
    for name, cls in sorted(MODEL_REGISTRY.items()):
        if cls.__module__.startswith(models.__name__):
            parser = argparse.ArgumentParser(prog=f"--arch {name}", add_help=False)
            if name in MODEL_DATACLASS_REGISTRY:
                gen_parser_from_dataclass(parser, MODEL_DATACLASS_REGISTRY[name]())
            else:
                cls.add_own_args(parser)  # what the plugin adds to the parent model's options
            parsers[f"model {name}"] = parser
    for name, dc in sorted(TASK_DATACLASS_REGISTRY.items()):
        if dc.__module__.startswith(tasks.__name__):
            parser = argparse.ArgumentParser(prog=f"--task {name}", add_help=False)
            # a task extending a fairseq task: only the option groups the plugin adds to it
            extends = any(base.__module__.startswith("fairseq.") for base in dc.__bases__)
            for base in dc.__mro__[1:] if extends else [dc]:
                if base.__module__.startswith(plugin):
                    gen_parser_from_dataclass(parser, base())
            parsers[f"task {name}"] = parser
    return parsers


def main(argv: list[str] | None = None) -> None:
    wanted = set(sys.argv[1:] if argv is None else argv)
    for title, parser in plugin_parsers().items():
        if not wanted or title.split()[-1] in wanted:
            print(f"=== {title}")
            print(parser.format_help())

if __name__ == "__main__":
    main()
