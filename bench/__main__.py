"""`python -m bench` lists the benchmarks; `python -m bench NAME [ARGS...]` runs one."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS: dict[str, str] = {
    "chain_load": "Loading a chain costs O(chain length), whatever else the table holds",
    "turns": "Parley's added latency and per-turn time vs a bare proxy; prompt cache share",
    "compaction": "Micro savings, post-compaction size, turn and compaction time, cache share",
    "token_estimates": "The token estimator against real usage in Claude Code transcripts",
    "durability": "Time to resume a run after kill -9 of its owner; hand-over on SIGTERM",
    "view_memos": "A turn's pure context work as a session grows, with and without memos",
}


def usage() -> str:
    lines = ["usage: python -m bench NAME [ARGS...]  (NAME --help for its options)", ""]
    lines += [f"  {name:<12} {about}" for name, about in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{name}")
    return int(module.main(rest))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
