"""MkDocs hooks: material that lives outside `docs/` joins the site as generated files.

- `notebooks/NAME.ipynb` becomes the page `notebooks/NAME.md`: markdown cells as they are, code
  cells as Python blocks and their committed outputs as text blocks and PNG images. Nothing is
  executed (the test suite runs the notebooks); an error output fails the build.
- `benchmarks/results/NAME.md` (every table but `REPORT.md`, which repeats them) becomes the page
  `results/NAME.md` (a GPU run's `.log` and `.txt` files join as plain files), and
  `benchmarks/results/plots/NAME.png` the image `plots/NAME.png`.
"""

import base64
import json
import pathlib
import re

from mkdocs.structure.files import File, Files

ROOT = pathlib.Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def fence(text: str, language: str = "text", title: str = "") -> str:
    ticks = "````" if "```" in text else "```"
    heading = f' title="{title}"' if title else ""
    return f"{ticks}{language}{heading}\n{ANSI.sub('', text).rstrip()}\n{ticks}"


def output_parts(output: dict, image: str, images: dict[str, bytes]) -> list[str]:
    """The markdown of one committed cell output; a PNG goes into `images` under `image`."""
    kind = output["output_type"]
    if kind == "error":
        raise ValueError(f"a committed notebook output is an error: {output.get('ename')}")
    if kind == "stream":
        return [fence("".join(output["text"]), title="output")]
    data = output.get("data", {})
    if "image/png" in data:
        images[image] = base64.b64decode("".join(data["image/png"]))
        return [f"![output]({pathlib.PurePath(image).relative_to('notebooks')})"]
    if "text/plain" in data:
        return [fence("".join(data["text/plain"]), title="output")]
    return []


def merge_streams(outputs: list[dict]) -> list[dict]:
    """The outputs with each run of consecutive stream outputs joined into one."""
    merged: list[dict] = []
    for output in outputs:
        if merged and output["output_type"] == "stream" == merged[-1]["output_type"]:
            text = "".join(merged[-1]["text"]) + "".join(output["text"])
            merged[-1] = {**merged[-1], "text": text}
        else:
            merged.append(output)
    return merged


def notebook_page(path: pathlib.Path) -> tuple[str, dict[str, bytes]]:
    """`(markdown, images)`: the page of one notebook and its images by site path."""
    parts: list[str] = []
    images: dict[str, bytes] = {}
    for number, cell in enumerate(json.loads(path.read_text())["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            parts.append(source)
        elif cell["cell_type"] == "code":
            parts.append(fence(source, "python"))
            for k, output in enumerate(merge_streams(cell.get("outputs", []))):
                image = f"notebooks/{path.stem}/cell{number}_{k}.png"
                parts.extend(output_parts(output, image, images))
    return "\n\n".join(parts) + "\n", images


def on_files(files: Files, config) -> Files:
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        page, images = notebook_page(path)
        files.append(File.generated(config, f"notebooks/{path.stem}.md", content=page))
        for uri, data in images.items():
            files.append(File.generated(config, uri, content=data))
    results = ROOT / "benchmarks" / "results"
    for path in sorted([*results.glob("*.md"), *results.glob("*.log"), *results.glob("*.txt")]):
        if path.name != "REPORT.md":  # logs join as plain files, linked from the pages
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    for path in sorted((results / "plots").glob("*.png")):
        files.append(File.generated(config, f"plots/{path.name}", abs_src_path=str(path)))
    return files
