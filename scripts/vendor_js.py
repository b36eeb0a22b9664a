"""Vendor the HTML report's JavaScript layout library from npm into the client package.

The page (gradcheck_core/outputs/html_report.py) lays the graph out with Graphviz `dot` where it is
installed and otherwise with dagre, a maintained layout library embedded in the page; dagre's
browser build ships inside the client package so a report works offline and self-contained.
The source map comment is dropped (the map is not shipped). Needs `npm` (the registry):

    python scripts/vendor_js.py
"""
from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

PACKAGE, VERSION = "@dagrejs/dagre", "3.1.3"
OUT = Path(__file__).resolve().parent.parent / "clients" / "python" / "gradcheck_core" / "vendor"


def vendor() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        name = subprocess.run(["npm", "pack", f"{PACKAGE}@{VERSION}", "--silent"], cwd=tmp, check=True,
                              capture_output=True, text=True, timeout=300).stdout.strip().splitlines()[-1]
        with tarfile.open(Path(tmp) / name) as tar:
            tar.extractall(tmp, filter="data")
        dist = Path(tmp) / "package"
        js = (dist / "dist" / "dagre.min.js").read_text()
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "dagre.min.js").write_text(js.replace("//# sourceMappingURL=dagre.min.js.map", ""))
        shutil.copy(dist / "LICENSE", OUT / "dagre.LICENSE")
        (OUT / "VERSION").write_text(f"{PACKAGE} {VERSION}\n")


if __name__ == "__main__":
    vendor()
    print(OUT)
