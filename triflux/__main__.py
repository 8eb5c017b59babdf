"""``python -m triflux``: demos and tools."""
import sys

USAGE = """usage: python -m triflux COMMAND [options]

commands:
  demo mlp     train a small classifier (Chain/Dense/Adam) on the digits data set
"""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        if not rest or rest[0] in ("-h", "--help"):
            print("usage: python -m triflux demo {mlp} [options]")
            return 0 if rest else 2
        if rest[0] == "mlp":
            from .demos.mlp import main as run
            return run(rest[1:])
        print(f"unknown demo {rest[0]!r}; available: mlp", file=sys.stderr)
        return 2
    print(f"unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
