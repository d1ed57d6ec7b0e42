"""Benchmark: mat's corpus build against `find | xargs cat`, and a re-ingest with nothing changed.

    python benchmarks/corpus_build.py [--files 20000] [--mb 200] [--reps 5] [--workdir DIR] [--json FILE]

It generates (once per seed and size; later runs reuse it) a tree of code-like text files with
about 5 % exact duplicates, a few hundred binaries and about 1,000 files in gitignored folders,
reads it once to warm the page cache, then measures, with medians over --reps repetitions:

  (a) mat: `Ingester([local_repo], staging, corpus=CorpusConfig(dir=...))`, `.fetch_all()`,
      `.build_corpus(...)` into a fresh output directory with a fresh staging directory (nothing
      from an earlier run to reuse), exactly as `mat ingest` does;
  (b) `find TREE -type f -print0 | xargs -0 cat > /dev/null`;
  (c) a second ingest with nothing changed: a new Ingester on the same staging and output
      directories, in the same process (as a Prefect worker or a library user would run it).

MB/s for (a) and (b) both divide the same number, the bytes of every regular file in the tree
(ignored and binary files included) / 1e6, by each one's wall time, so mat/cat is a time ratio.
The figures are printed, and the last line of stdout is the JSON summary (also --json FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from multiagenttrainer.config import CorpusConfig, LocalRepoSource  # noqa: E402
from multiagenttrainer.ingest import Ingester  # noqa: E402

TREE_FORMAT = 2  # bump when the generator changes, so old trees are regenerated
MEDIAN_FILE_BYTES = 8_000
SIZE_SIGMA = 0.67  # lognormal spread: mean ~1.25x the median, like real repositories
DUPLICATE_SHARE = 0.05
BINARY_FILES = 300
IGNORED_FILES = 1_000
FILES_PER_DIR = 20

WORDS = (  # noqa: SIM905
    "value result items index count name path config data buffer stream reader writer node tree "
    "parse load save user request response handler error message format length offset size cache "
    "client server session queue worker task event state record field schema model table column "
    "source target options params header body status update create delete fetch commit branch"
).split()

PYTHON = [
    "def {f}({a}, {b}):",
    "    return {a}.{f}({b})",
    "    {a} = {b}[{n}]",
    "    if {a} is None:",
    '        raise ValueError("{w} {w} {w}")',
    "import {w}",
    "from {w}.{w} import {C}",
    "class {C}({C}):",
    "    # {w} {w} {w} {w} {w}",
    "    for {a} in {b}:",
    "        {a}.append({b})",
    '    """{W} the {w} of a {w}."""',
    "    {a}: {T} = {n}",
    "",
    "    with open({a}) as {b}:",
    "        {a} += len({b})",
    "    self.{a} = {b}",
    '    log.info("%s %s", {a}, {b})',
]
JAVASCRIPT = [
    "const {a} = require('{w}');",
    "function {f}({a}, {b}) {{",
    "  return {a}.{f}({b});",
    "}}",
    "  if ({a} === {b}) {{",
    "export default {C};",
    "  const {a} = await {f}({b});",
    "  // {w} {w} {w}",
    "  for (const {a} of {b}) {{",
    "    {a}.push({b});",
    "  }}",
    "",
    "  this.{a} = {b} || {n};",
]
GO = [
    "func {C}({a} {T}) ({T}, error) {{",
    "\t{a}, err := {f}({b})",
    "\tif err != nil {{",
    "\t\treturn nil, err",
    "\t}}",
    "}}",
    "",
    "// {C} {w} the {w} {w}.",
    "\t{a} := make([]{T}, 0, {n})",
    "\tfor _, {a} := range {b} {{",
    "type {C} struct {{",
    "\t{C} {T}",
    "package {w}",
]
MARKDOWN = [
    "# {W} {w}",
    "",
    "The {w} {w} keeps a {w} for every {w}, so {w} and {w} stay in sync.",
    "- `{a}`: the {w} of the {w}",
    "See https://example.com/{w}/{w} for the {w} {w}.",
    "Run `{w} {w}` to {w} the {w}.",
]
# A little of what real code has: the words secret scanners look at, with no secret in them.
SENSITIVE = [
    "    token = self.{a}.get_token()",
    '    password = os.environ["{W}_PASSWORD"]',
    "    headers = {{'Authorization': f'Bearer {{token}}'}}",
    "# Set GITHUB_TOKEN before running.",
    '    secret_name = "{w}/{w}"',
    '    url = "https://example.com/{w}"',
]
LANGUAGES = {".py": PYTHON, ".js": JAVASCRIPT, ".go": GO, ".md": MARKDOWN}
EXTENSION_WEIGHTS = {".py": 5, ".js": 3, ".go": 2, ".md": 1}


def fill(template: str, rng: random.Random) -> str:
    """One line from a template; every {w} gets its own random word, the other fields one per line."""
    while "{w}" in template:
        template = template.replace("{w}", rng.choice(WORDS), 1)
    return template.format(
        f=rng.choice(WORDS) + "_" + rng.choice(WORDS),
        a=rng.choice(WORDS),
        b=rng.choice(WORDS),
        C=rng.choice(WORDS).title() + rng.choice(WORDS).title(),
        W=rng.choice(WORDS).title(),
        n=rng.randint(0, 4096),
        T=rng.choice(["int", "str", "bytes", "float64"]),
    )


def line_pools(rng: random.Random) -> dict[str, list[str]]:
    """Per extension, a few thousand distinct lines to draw files from."""
    pools = {}
    for ext, templates in LANGUAGES.items():
        lines = [fill(rng.choice(templates), rng) + "\n" for _ in range(4000)]
        lines += [fill(rng.choice(SENSITIVE), rng) + "\n" for _ in range(8)]
        pools[ext] = lines
    return pools


def file_sizes(count: int, total_bytes: int, rng: random.Random) -> list[int]:
    """Lognormal sizes around MEDIAN_FILE_BYTES, scaled so they add up to about total_bytes."""
    raw = [
        min(rng.lognormvariate(0, SIZE_SIGMA) * MEDIAN_FILE_BYTES, 40 * MEDIAN_FILE_BYTES)
        for _ in range(count)
    ]
    scale = total_bytes / sum(raw)
    return [max(64, int(size * scale)) for size in raw]


def text_file(index: int, ext: str, size: int, pool: list[str], rng: random.Random) -> bytes:
    """A code-like file of about `size` bytes; the first line makes it unique."""
    head = {".py": "#", ".js": "//", ".go": "//", ".md": "<!--"}[ext] + f" file {index}\n"
    per_line = sum(map(len, pool)) / len(pool)
    body = "".join(rng.choices(pool, k=max(1, round(size / per_line))))
    return (head + body).encode()


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def generate_tree(tree: Path, files: int, total_mb: float, seed: int) -> None:
    """Write the benchmark tree from scratch."""
    rng = random.Random(seed)
    pools = line_pools(rng)
    exts = rng.choices(list(EXTENSION_WEIGHTS), weights=list(EXTENSION_WEIGHTS.values()), k=files)
    sizes = file_sizes(files, int(total_mb * 1e6), rng)
    unique = files - int(files * DUPLICATE_SHARE)
    written: list[tuple[str, bytes]] = []
    for i in range(files):
        rel = f"src/pkg{i // (FILES_PER_DIR * 10):03d}/mod{(i // FILES_PER_DIR) % 10}/f{i:05d}"
        if i < unique:
            data = text_file(i, exts[i], sizes[i], pools[exts[i]], rng)
            ext = exts[i]
        else:
            ext, data = rng.choice(written)  # an exact duplicate under another name
        write(tree / (rel + ext), data)
        written.append((ext, data))
    for i in range(BINARY_FILES):
        blob = rng.randbytes(rng.randint(1_000, 60_000))
        write(tree / f"assets/img{i // 50}/b{i:04d}.png", b"\x89PNG\r\n\x1a\n\x00" + blob)
    for i in range(IGNORED_FILES):
        where = f"node_modules/lib{i // 40}/index{i}.js" if i % 10 < 7 else f"build/out{i // 30}/gen{i}.js"
        write(tree / where, text_file(10**6 + i, ".js", 6_000, pools[".js"], rng))
    (tree / ".gitignore").write_text("node_modules/\nbuild/\n*.log\n")
    (tree / "src/pkg000/.gitignore").write_text("*.tmp\n")


def ensure_tree(workdir: Path, files: int, total_mb: float, seed: int) -> Path:
    """The benchmark tree under workdir, generated unless one with the same parameters exists."""
    tree, marker = workdir / "tree", workdir / "tree.json"
    params = {"format": TREE_FORMAT, "files": files, "mb": total_mb, "seed": seed}
    if marker.is_file() and json.loads(marker.read_text()) == params and tree.is_dir():
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    marker.unlink(missing_ok=True)
    started = time.perf_counter()
    generate_tree(tree, files, total_mb, seed)
    marker.write_text(json.dumps(params))
    print(f"generated {tree} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return tree


def tree_bytes(tree: Path) -> tuple[int, int]:
    """(files, bytes) of every regular file under tree."""
    count = total = 0
    for dirpath, _dirs, names in os.walk(tree):
        for name in names:
            count += 1
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return count, total


def time_cat(tree: Path) -> float:
    """Seconds for `find TREE -type f -print0 | xargs -0 cat > /dev/null`."""
    started = time.perf_counter()
    subprocess.run(f"find '{tree}' -type f -print0 | xargs -0 cat > /dev/null", shell=True, check=True)
    return time.perf_counter() - started


def ingest(tree: Path, staging: Path, out: Path) -> tuple[float, dict[str, Any]]:
    """Seconds for a whole library-level ingest of the tree into out/, and the stats."""
    started = time.perf_counter()
    source = LocalRepoSource(type="local_repo", path=str(tree), name="bench")
    ingester = Ingester([source], staging, corpus=CorpusConfig(dir=str(out)))
    result = ingester.fetch_all()
    if result.failures:
        raise SystemExit(f"ingest failed: {result.failures}")
    stats = ingester.build_corpus(out / "corpus.txt")
    return time.perf_counter() - started, stats


def measure(tree: Path, workdir: Path, reps: int) -> dict[str, Any]:
    """Interleaved repetitions of (a) and (b), then (c) on the last output; medians."""
    files, nbytes = tree_bytes(tree)
    time_cat(tree)  # warm the page cache
    staging, mat_s, cat_s, stats = workdir / "staging", [], [], {}
    for rep in range(reps):
        out = workdir / "out"
        for previous in (out, staging):  # a cold build: no corpus and no listing snapshot to reuse
            shutil.rmtree(previous, ignore_errors=True)
        os.sync()  # let the file system finish freeing the previous output before timing
        seconds, stats = ingest(tree, staging, out)
        mat_s.append(seconds)
        cat_s.append(time_cat(tree))
        print(f"rep {rep + 1}: mat {seconds:.3f} s, cat {cat_s[-1]:.3f} s", file=sys.stderr)
    again_s = []
    for _ in range(reps):
        seconds, again = ingest(tree, staging, workdir / "out")
        if not again.get("reused"):
            raise SystemExit("the second ingest rebuilt the corpus; expected it to be reused")
        again_s.append(seconds)
        print(f"re-ingest: {seconds:.3f} s", file=sys.stderr)
    mat, cat, reingest = statistics.median(mat_s), statistics.median(cat_s), statistics.median(again_s)
    mb = nbytes / 1e6
    return {
        "tree_files": files,
        "tree_mb": round(mb, 1),
        "mb_definition": "bytes of every regular file in the tree / 1e6, the same for mat and cat",
        "corpus_files": stats["files"],
        "corpus_mb": round(stats["bytes"] / 1e6, 1),
        "skipped": stats["skipped"],
        "mat_s": round(mat, 3),
        "cat_s": round(cat, 3),
        "mat_mb_s": round(mb / mat, 1),
        "cat_mb_s": round(mb / cat, 1),
        "mat_over_cat": round(cat / mat, 3),
        "reingest_s": round(reingest, 3),
        "reingest_fraction": round(reingest / mat, 3),
        "reps": reps,
        "workers": stats["workers"],
        "native": stats.get("native"),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=20_000, help="text files in the tree")
    parser.add_argument("--mb", type=float, default=200.0, help="total size of the text files, MB")
    parser.add_argument("--reps", type=int, default=5, help="repetitions; medians are reported")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / ".work")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    tree = ensure_tree(args.workdir.resolve(), args.files, args.mb, args.seed)
    figures = measure(tree, args.workdir.resolve(), args.reps)
    print(f"tree: {figures['tree_files']} files, {figures['tree_mb']} MB ({figures['mb_definition']})")
    print(
        f"(a) mat ingest: {figures['mat_s']:.3f} s = {figures['mat_mb_s']} MB/s "
        f"({figures['corpus_files']} files, {figures['corpus_mb']} MB kept)"
    )
    print(f"(b) find | xargs cat: {figures['cat_s']:.3f} s = {figures['cat_mb_s']} MB/s")
    print(f"mat/cat: {figures['mat_over_cat']} (target >= 0.9)")
    print(
        f"(c) re-ingest, nothing changed: {figures['reingest_s']:.3f} s = "
        f"{figures['reingest_fraction']} of the first (target <= 0.1)"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
