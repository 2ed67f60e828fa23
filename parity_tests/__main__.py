"""python -m parity_tests: the parity report (see parity_tests/report.py)."""

import sys


def main(argv=None) -> int:
    from parity_tests.report import main as report_main

    return report_main(argv)


if __name__ == "__main__":
    sys.exit(main())
