"""Pin the images of every deploy overlay by digest (deploy/README.md, "Pinned images").

    python scripts/pin_images.py cpu=sha256:<64 hex> [gpu=sha256:...] [graphs=sha256:...] [--deploy DIR]

A kustomization's `images:` entry is the variant of its tag: gradcheck's (by its name `gradcheck`, or the
registry's name an overlay on another overlay retags) `newTag: <version>-cpu` is "cpu",
`-gpu` is "gpu", the `graphs` entry (batch-volume's graphs image) is "graphs". Each entry of a variant given
gets that `digest:` (added after its newTag, or replaced); comments and everything else stay as written. The
digest of an image just pushed: `docker buildx imagetools inspect IMAGE:TAG --format '{{json .Manifest.Digest}}'`
(or `crane digest IMAGE:TAG`). Exit 2, one line, for a malformed argument or a variant no overlay has.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
VARIANTS = ("cpu", "gpu", "graphs")
ENTRY = re.compile(r"^(?P<indent>\s*)- name: (?P<name>\S+)[^\n]*\n(?P<body>(?:(?P=indent)  [^\n]*\n)*)", re.M)


def variant(name: str, body: str) -> str | None:
    if name == "graphs":
        return "graphs"
    tag = re.search(r"newTag: \"?([^\"\n]+)", body)
    if (name == "gradcheck" or name.endswith("/gradcheck")) and tag:
        return next((v for v in ("cpu", "gpu") if tag.group(1).endswith("-" + v)), None)
    return None


def pin_text(text: str, digests: dict[str, str]) -> tuple[str, set[str]]:
    """The kustomization's text with its images' digests set; the variants it holds."""
    found = set()

    def one(m: re.Match) -> str:
        v = variant(m["name"], m["body"])
        if v is None:
            return m[0]
        found.add(v)
        if v not in digests:
            return m[0]
        body = re.sub(r"^\s*digest: [^\n]*\n", "", m["body"], flags=re.M)
        line = f"{m['indent']}  digest: {digests[v]}\n"
        body = re.sub(r"^(\s*newTag: [^\n]*\n)", lambda t: t[1] + line, body, count=1, flags=re.M)
        return m[0][:len(m[0]) - len(m["body"])] + body

    head, sep, rest = text.partition("\nimages:\n")
    if not sep:
        return text, found
    return head + sep + ENTRY.sub(one, rest), found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="pin_images.py", description=__doc__.split("\n\n")[0])
    p.add_argument("pins", nargs="+", metavar="VARIANT=DIGEST")
    p.add_argument("--deploy", default=str(Path(__file__).resolve().parents[1] / "deploy"), metavar="DIR")
    args = p.parse_args(argv)
    digests = {}
    for pin in args.pins:
        v, _, d = pin.partition("=")
        if v not in VARIANTS or not DIGEST.fullmatch(d):
            print(f"pin_images.py: '{pin[:100]}': want VARIANT=sha256:<64 hex>, VARIANT one of "
                  f"{', '.join(VARIANTS)}", file=sys.stderr)
            return 2
        digests[v] = d
    seen = set()
    for k in sorted(Path(args.deploy).rglob("kustomization.yaml")):
        text = k.read_text()
        new, found = pin_text(text, digests)
        seen |= found
        if new != text:
            k.write_text(new)
    if set(digests) - seen:
        print(f"pin_images.py: no overlay uses {', '.join(sorted(set(digests) - seen))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
