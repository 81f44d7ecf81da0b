"""Command line: ``python -m harness list``, ``compare``, ``cuda-info``, ``verdicts``, the experiments."""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from pathlib import Path
from subprocess import CalledProcessError

from harness.backends import cuda, llama_cpp
from harness.backends.c import clib
from harness.backends.external import ExternalError, add_external, is_external
from harness.env import files
from harness.env.cores import usable_cores
from harness.env.switches import switch_problems
from harness.experiments import EXPERIMENTS
from harness.experiments.arguments import count_at_least, positive_seconds, shape_without_zeros
from harness.model import quant, registry
from harness.model.core import run_mode
from harness.model.errors import MatmulInputError, UnavailableError
from harness.model.inputs import parse_shape, shape_argument
from harness.model.registry import describe
from harness.run.compare import compare
from harness.run.render import short_dtype
from harness.tooling import ab
from harness.tooling.headline import write
from harness.tooling.report import write_report
from harness.tooling.verdicts import main as judge

INTERRUPTED = 130  # main's status after Ctrl-C (128 + SIGINT, what a shell reports for one)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit code 2."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _seed(text: str) -> int:
    """A seed NumPy's generator takes: a whole number >= 0 (a usage error otherwise, not a row error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seed {text!r}: expected a whole number >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid seed {value}: seeds are whole numbers >= 0")
    return value


def _weight_format(text: str) -> str:
    """--weights: a format of harness.quant (any case: q4_K, Q4_K) or float32."""
    if text.lower() == "float32":
        return "float32"
    try:
        return quant.format_of(text).name
    except MatmulInputError:
        raise argparse.ArgumentTypeError(
            f"invalid weight format {text!r}: choose from {', '.join(quant.FORMATS)}, float32"
        ) from None


def _plot_path(text: str) -> str:
    """A --plot destination in a format matplotlib writes (checked before anything is measured)."""
    problem = files.plot_format_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _thread_count_problem(args, command_parser) -> str | None:
    """Why a --threads the user gave cannot be honoured: more threads than this process has
    cores would be recorded as that many threads, and its % peak divided by them."""
    given = getattr(args, "threads", None)
    if given is None or given == command_parser.get_default("threads"):
        return None  # a command's own default is its choice

    cores = usable_cores()
    lowest = 0 if args.command == "compare" else 1
    for value in given if isinstance(given, list) else [given]:
        if not lowest <= value <= cores:
            zero = ", or 0 for each library's default" if args.command == "compare" else ""
            return f"--threads {value}: this process may use {cores} core(s); choose 1 to {cores}{zero}"
    return None


def implementation_table(markdown: bool = False) -> str:
    """Every implementation, with whether it can run here (or, for --markdown, its metadata)."""
    impls = registry.implementations()
    if markdown:
        lines = [
            "| implementation | language | device | dtypes | source | what it is |",
            "|---|---|---|---|---|---|",
        ]
        for impl in impls:
            source = f"[`{impl.source}`]({impl.source})" if impl.source else ""
            op = " (GEMV, M = 1)" if impl.operation == "gemv" else ""
            lines.append(
                f"| `{impl.name}` | {impl.language} | {impl.device} | {', '.join(impl.dtypes)} | {source} | "
                f"{impl.summary}{op} |"
            )
        return "\n".join(lines) + "\n"
    # a line per implementation, then whether it runs here, wrapped to the terminal (80 columns
    # hold the first line; a table with the reasons in a column was 200 wide)
    width = shutil.get_terminal_size((100, 24)).columns
    rows = [
        (impl.name, impl.device, impl.operation, ", ".join(short_dtype(d) for d in impl.dtypes), impl.source or "")
        for impl in impls
    ]
    widths = [max(len(row[c]) for row in rows + [_LIST_HEADINGS]) for c in range(len(_LIST_HEADINGS) - 1)]

    def line(cells):
        return "  ".join(f"{cell:<{w}}" for cell, w in zip(cells, widths)) + "  " + cells[-1]

    lines = ["implementations, in reading order (f32 = float32, bf16 = bfloat16, ...):", "", line(_LIST_HEADINGS)]
    for impl, row in zip(impls, rows):
        reason = impl.unavailable_reason()
        if reason is None:
            mode = run_mode(impl)
            available = "yes" if mode == "native" else f"yes, {mode} on the CPU (checked, not timed)"
            detail = describe(impl)
            available += f": {detail}" if detail else ""
        else:
            available = f"no: {reason}"
        lines.append(line(row).rstrip())
        lines += textwrap.wrap(available, max(width - 1, 40), initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines) + "\n"


_LIST_HEADINGS = ("implementation", "device", "op", "dtypes", "source")


def _run_experiment(name: str, out: str, options: dict) -> None:
    """Say what runs and for how long, run it, then say what it found and where it wrote."""

    module = EXPERIMENTS[name]
    width = max(shutil.get_terminal_size((100, 24)).columns, 40)

    def say(text, indent):  # wrapped to the terminal, a long line's rest indented further; names kept whole
        indent += " " * (len(text) - len(text.lstrip()))
        lines = textwrap.wrap(
            text.strip(),
            width,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        print("\n".join(lines), flush=True)

    say(f"== {name}: {module.TITLE} ({module.DURATION})", "")
    data = module.run(out, **options)
    for line in module.findings(data):
        say(line, "   ")
    say(f"wrote {out}/{name}.json and {out}/{name}.png", "   ")


def main(argv=None) -> int:
    parser = _Parser(prog="python -m harness", description="Compare the matmuls of this repository.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    listing = commands.add_parser("list", help="list every implementation and whether it can run here")
    listing.add_argument("--markdown", action="store_true", help="print the README's Markdown table")

    cuda_info = commands.add_parser(
        "cuda-info",
        help="registers per thread, shared memory per block and spills of every CUDA kernel (nvcc, no GPU needed)",
    )
    cuda_info.add_argument("--arch", nargs="+", default=None, metavar="SM", help="architectures (default sm_80 sm_90)")

    comparing = commands.add_parser(
        "compare",
        help="check and time implementations side by side",
        description="Shapes are N (square) or MxNxK: C = A @ B is M x N, K is the inner dimension.",
    )
    comparing.add_argument(
        "--shapes",
        nargs="+",
        type=shape_argument,
        default=[parse_shape(256)],
        metavar="SHAPE",
        help="N or MxNxK (default 256)",
    )
    comparing.add_argument(
        "--impls",
        nargs="+",
        default=None,
        metavar="PATTERN",
        help="names or glob patterns, e.g. 'c.*' numpy (default: all); your own as "
        "FILE:FUNCTION, e.g. mine.py:matmul or mine.c:my_matmul",
    )
    comparing.add_argument(
        "--dtype",
        "--dtypes",
        dest="dtypes",
        nargs="+",
        default=["float32"],
        choices=["float32", "float64", "float16", "bfloat16"],
        metavar="DTYPE",
        help="float32 (default), float64, float16, bfloat16",
    )
    comparing.add_argument(
        "--weights",
        nargs="+",
        default=None,
        metavar="FORMAT",
        type=_weight_format,
        help=f"decode: float32 activations times weights stored as {', '.join(quant.FORMATS)} or float32 "
        "(shapes MxNxK: M rows of activations, W [N, K]); the float32 product is added",
    )
    comparing.add_argument(
        "--weights-from",
        choices=["dram", "cache"],
        default="dram",
        help="decode rows on the CPU: read W from DRAM, rotating through copies of it as a model's decode "
        "does (default), or from cache (one W, repeated)",
    )
    comparing.add_argument(
        "--threads", type=int, default=1, help="BLAS and kernel threads (default 1; 0 = library default)"
    )
    comparing.add_argument(
        "--min-time", type=positive_seconds, default=0.2, help="seconds of timed runs per row (default 0.2)"
    )
    comparing.add_argument(
        "--rounds",
        type=count_at_least(1),
        default=1,
        help="time each problem's rows this many times in turn, each round in another order, and keep each "
        "row's median round (default 1; on a shared machine 3 keeps a slow spell from deciding a ratio)",
    )
    comparing.add_argument("--seed", type=_seed, default=0, help="seeds the inputs (an integer >= 0; default 0)")
    comparing.add_argument("--allow-slow", action="store_true", help="run pure Python even on sizes that take hours")
    comparing.add_argument(
        "--timeout",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="the longest one call of an isolated row may take before it counts as hung "
        "(default: grows with the problem, at least 30)",
    )
    comparing.add_argument(
        "--isolate",
        choices=["user", "all"],
        default="user",
        help="run in a worker process of its own, where a crash or a hang is a row: your own "
        "kernels (user, the default) or every CPU implementation (all)",
    )
    comparing.add_argument("--no-baseline", action="store_true", help="do not add the library baseline")
    comparing.add_argument("--json", metavar="PATH", help="write results and machine info as JSON")
    comparing.add_argument("--csv", metavar="PATH", help="write results as CSV")
    comparing.add_argument(
        "--plot", metavar="PATH", type=_plot_path, help="draw GFLOP/s against size (PNG; SVG, PDF... by suffix)"
    )
    comparing.add_argument("--no-progress", action="store_true")

    for name, module in EXPERIMENTS.items():
        experiment = commands.add_parser(name, help=module.TITLE)
        module.add_arguments(experiment)
        experiment.add_argument(
            "--out", default="out", metavar="DIR", help=f"where {name}.json and {name}.png go (default out)"
        )

    command_parsers = dict(commands.choices)
    everything = commands.add_parser("experiments", help="run every experiment, then write the report")
    everything.add_argument("--out", default="out", metavar="DIR")
    everything.add_argument("--only", nargs="+", choices=list(EXPERIMENTS), metavar="NAME", help="a subset, by name")
    verdicts = commands.add_parser("verdicts", help="judge the GPU speed targets from comparison JSON files")
    verdicts.add_argument("json_files", nargs="+", metavar="JSON")
    heading = commands.add_parser(
        "headline", help="the README's headline table and figure, from results/*/comparison.json"
    )
    heading.add_argument("directories", nargs="*", default=["results/cpu", "results/gpu"], metavar="DIR")
    heading.add_argument(
        "--out", default="results", metavar="DIR", help="where headline.md and .png go (default results)"
    )
    building = commands.add_parser(
        "build-llama-cpp",
        help="build current llama.cpp's CPU backend, the decode rows' peer (optional; a minute or two)",
    )
    building.add_argument(
        "--source", default=None, metavar="DIR", help="a llama.cpp checkout to build (default: download the pinned one)"
    )
    before_after = commands.add_parser(
        "ab",
        help="time a C implementation as a git revision built it against this checkout's, in turn, one thread",
    )
    before_after.add_argument(
        "--before",
        default="HEAD",
        metavar="REVISION|LIBRARY",
        help="a git revision (built once, cached) or a library file (default HEAD: the last commit)",
    )
    before_after.add_argument("--impls", nargs="+", default=["c.packed"], metavar="NAME", help="default c.packed")
    before_after.add_argument(
        "--shapes",
        nargs="+",
        type=shape_without_zeros,
        default=list(ab.DEFAULT_SHAPES),
        metavar="SHAPE",
        help=f"N or MxNxK (default {' '.join(ab.DEFAULT_SHAPES)})",
    )
    before_after.add_argument(
        "--dtypes",
        nargs="+",
        choices=["float32", "float64", "bfloat16"],
        default=["float32"],
        metavar="DTYPE",
        help="float32 (default), float64, bfloat16 (c.bf16's)",
    )
    before_after.add_argument(
        "--weights",
        nargs="+",
        type=_weight_format,
        metavar="FORMAT",
        help="a decode implementation's W formats (default: every one it takes; MxNxK is then X [M, K], W [N, K])",
    )
    before_after.add_argument("--rounds", type=count_at_least(3), default=15, help="interleaved rounds (default 15)")
    before_after.add_argument(
        "--sample-time", type=positive_seconds, default=0.05, help="seconds a sample times (default 0.05)"
    )
    before_after.add_argument("--threads", type=int, default=1, help="1 (the only count ab can interleave)")
    before_after.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    reporting = commands.add_parser("report", help="gather the experiments' JSON and plots in DIR into DIR/REPORT.md")
    reporting.add_argument("directory", nargs="?", default="out")

    args = parser.parse_args(argv)
    try:
        return _dispatch(parser, command_parsers, args)
    except KeyboardInterrupt:
        # Outputs are written whole or not at all (files.py) and only after the measuring, so
        # an interrupted command leaves none; a C call still running finishes in the background.
        sys.stderr.write(
            f"{parser.prog} {args.command}: interrupted (Ctrl-C); files are written whole or "
            "not at all, so none is left half-written\n"
        )
        return INTERRUPTED
    except OSError as error:  # a write that failed after the checks (a disk that filled up, say)
        if error.filename:  # files.replacing names the file, and left no part of it behind
            sys.stderr.write(f"cannot write {error.filename}: {error.strerror or error}\n")
        else:
            sys.stderr.write(f"{parser.prog} {args.command}: {error}\n")
        return 1


def _refuse_unwritable(parser, paths=(), folders=()) -> None:
    """A usage error, before anything is measured, for a destination that cannot be written."""
    for path in paths:
        problem = path and files.unwritable_reason(path)
        if problem:
            parser.error(f"cannot write {path}: {problem}")
    for folder in folders:
        problem = files.unwritable_folder_reason(folder)
        if problem:
            parser.error(f"cannot write into {folder}: {problem}")


def _dispatch(parser, command_parsers, args) -> int:
    """The checks every command shares (switches, --threads), then the command's own function."""

    for problem in switch_problems():
        parser.error(problem)
    if args.command in command_parsers:
        problem = _thread_count_problem(args, command_parsers[args.command])
        if problem:
            parser.error(problem)
    command = _experiment_command if args.command in EXPERIMENTS else COMMANDS[args.command]
    return command(parser, args)


def _experiment_command(parser, args) -> int:
    _refuse_unwritable(parser, folders=[args.out])
    options = {k: v for k, v in vars(args).items() if k not in ("command", "out")}
    try:
        _run_experiment(args.command, args.out, options)
    except ValueError as error:  # a bad option value the experiment refused
        parser.error(str(error))
    return 0


def _experiments_command(parser, args) -> int:

    _refuse_unwritable(parser, folders=[args.out])
    for name in args.only or EXPERIMENTS:
        _run_experiment(name, args.out, {})
    print(f"wrote {write_report(args.out)}")
    return 0


def _report_command(parser, args) -> int:

    if Path(args.directory).is_dir():  # (a missing one has nothing to report)
        _refuse_unwritable(parser, paths=[str(Path(args.directory) / "REPORT.md")])
    problems: list[str] = []
    try:
        print(f"wrote {write_report(args.directory, problems)}")
    except FileNotFoundError as error:
        sys.stderr.write(f"{error}\n")
        return 1
    for problem in problems:
        sys.stderr.write(f"left out: {problem}\n")
    return 1 if problems else 0


def _headline_command(parser, args) -> int:

    _refuse_unwritable(parser, folders=[args.out])
    try:
        for path in write(args.directories, args.out):
            print(f"wrote {path}")
    except FileNotFoundError as error:
        sys.stderr.write(f"{error}\n")
        return 1
    return 0


def _verdicts_command(parser, args) -> int:

    return judge(args.json_files)


def _list_command(parser, args) -> int:
    sys.stdout.write(implementation_table(args.markdown))
    return 0


def _cuda_info_command(parser, args) -> int:

    try:
        sys.stdout.write(cuda.resource_table(tuple(args.arch or cuda.ARCHS)))
    except RuntimeError as error:
        sys.stderr.write(f"{error}\n")
        return 1
    return 0


def _compare_command(parser, args) -> int:

    try:  # your own implementations, FILE:FUNCTION, join the registry under their names
        args.impls = [add_external(spec) if is_external(spec) else spec for spec in args.impls or []] or None
    except ExternalError as error:
        parser.error(str(error))
    try:
        registry.implementations(*(args.impls or []))
    except KeyError as error:
        parser.error(str(error.args[0]))
    _refuse_unwritable(parser, paths=[args.json, args.csv, args.plot])
    results = compare(
        args.shapes,
        args.impls,
        args.dtypes,
        threads=args.threads or None,
        min_time=args.min_time,
        seed=args.seed,
        allow_slow=True if args.allow_slow else None,
        baselines=not args.no_baseline,
        progress=not args.no_progress and sys.stderr.isatty(),
        weights=args.weights,
        isolate=args.isolate,
        timeout=args.timeout,
        weights_from=args.weights_from,
        rounds=args.rounds,
    )
    print(results)
    for path, writer in ((args.json, results.to_json), (args.csv, results.to_csv), (args.plot, results.plot)):
        if path:
            print(f"wrote {writer(path)}")
    failed = [r for r in results.rows if r.failed]
    if failed:
        sys.stderr.write(f"{len(failed)} row(s) failed, raised, crashed or hung: see the status column\n")
        return 1
    if not any(r.passed for r in results.rows):
        sys.stderr.write("nothing ran: every row was skipped or unavailable (see the status column)\n")
        return 1
    return 0


def _build_llama_cpp_command(parser, args) -> int:
    try:
        llama_cpp.build(Path(args.source) if args.source else None)
    except CalledProcessError as error:
        output = (error.stderr or b"").decode(errors="replace") if isinstance(error.stderr, bytes) else error.stderr
        sys.stderr.write(
            f"building llama.cpp failed: {' '.join(map(str, error.cmd[:3]))} ...\n{(output or '')[-3000:]}\n"
        )
        return 1
    except UnavailableError as error:
        sys.stderr.write(f"{error}\n")
        return 1
    return 0


def _ab_command(parser, args) -> int:
    if args.threads != 1:
        parser.error(
            f"ab times one thread only (--threads {args.threads}): each build's idle workers would take a core "
            "from the other's samples; time each build in its own process instead "
            f"(MATMUL_C_LIBRARY=<library> python -m harness blas-grid --threads {args.threads}, in turn)"
        )
    _refuse_unwritable(parser, paths=[args.json])
    unknown = [name for name in args.impls if name not in registry.REGISTRY]
    if unknown:
        parser.error(f"unknown implementation {', '.join(unknown)} (python -m harness list names them)")
    try:
        data = ab.run(
            args.before, args.impls, args.shapes, args.dtypes, args.rounds, args.sample_time, args.json, args.weights
        )
    except (ab.ABError, clib.CLibraryError) as error:
        sys.stderr.write(f"{parser.prog} ab: {error}\n")
        return 1
    print(ab.table(data))
    if args.json:
        print(f"wrote {args.json}")
    return 1 if any("skipped" in row for row in data["rows"]) else 0


COMMANDS = {
    "ab": _ab_command,
    "build-llama-cpp": _build_llama_cpp_command,
    "list": _list_command,
    "cuda-info": _cuda_info_command,
    "compare": _compare_command,
    "experiments": _experiments_command,
    "headline": _headline_command,
    "verdicts": _verdicts_command,
    "report": _report_command,
}
