"""``quasar step2``, a miner's second step: tune the QuasarAttention kernel's tunables on this GPU.

    quasar step2 --repo-path FORK [--seq-lens 65536,262144,1M] [--out DIR] [--commit]
    quasar step2 --repo-path FORK --grid '[{"segment_chunks": 8}, {}]'

The fork's current ``fla/ops/quasar/tuning.json`` and every configuration of the grid (default:
segment sizes 16, 32, 64 chunks x the WY pass's warps and register cap, 1 warp uncapped or 2 warps
uncapped or capped at 168, x its two inverses) are each written as ``tuning.json`` into a scratch
copy of the fork and evaluated by the harness (sandboxed, checked against the reference) at every
``--seq-lens`` (the longest is the target). A configuration the chip runs exactly as the current
one is not evaluated twice.

A configuration replaces the current one only when it is faster at the target by more than the
measurements can tell apart (:func:`choose`): more than two evaluations of one tree differ (2%)
and more than twice the combined uncertainty of the two medians. On the CPU nothing is chosen:
Triton's interpreter runs the kernels there, and its timings say nothing about a GPU.

Nothing is written into the fork without ``--commit``: then the chosen configuration replaces its
``tuning.json`` whole (per-chip ``devices`` entries included, so that it applies on every chip)
and is committed. Without it the run shows what it would write. The table of tokens/sec per
configuration and length is printed; the plot (PNG) and the raw results (JSON) go to ``--out``
(default: a folder beside the fork, ``FORK-tuning``), never into the fork or the suite.

The tunables and their meaning: the fork's ``fla/ops/quasar/tuning.py`` (written by step 1).
Exit status 0 when a configuration passed, 1 when none did, 2 for bad arguments or a failed commit.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from quasar.config.values import format_seq_lens
from quasar.errors import QuasarError
from quasar.evaluate.cli import add_evaluation_arguments, options_from, parse_seq_lens, refusal, start
from quasar.evaluate.harness import evaluate
from quasar.evaluate.options import EvaluationInputError
from quasar.evaluate.report import OK
from quasar.starter_fork import tuning_contract
from quasar.terminal import WrappingParser, compact_rate, compact_table

TUNING_PATH = Path("fla/ops/quasar/tuning.json")
PLOT_NAME = "kernel_tuning.png"
RESULTS_NAME = "kernel_tuning.json"
DEFAULT_SEQ_LENS = (65_536, 262_144, 1_000_000)
# The tunables that moved the layer most on an H100 and an H200 (benchmarks/RESULTS.md): segment
# size, the WY pass's warps with its register cap (one warp with the compiler's registers; two:
# uncapped, or 168, the shipped cap) and how it inverts its diagonal blocks.
DEFAULT_GRID = [
    {"segment_chunks": chunks, "wy_warps": warps, "wy_maxnreg": maxnreg, "wy_inverse": inverse}
    for chunks, (warps, maxnreg), inverse in itertools.product(
        (16, 32, 64), ((1, 0), (2, 0), (2, 168)), ("substitution", "product")
    )
]
# How far apart two evaluations of the same tree on the same GPU may put a length's median: the
# harness's agreement bound (benchmarks/RESULTS.md, `quasar bench harness`). A smaller gain is noise.
RUN_TO_RUN = 0.02
# The standard error of a median is about sqrt(pi/2) times that of a mean (normal timings).
_MEDIAN_ERROR = math.sqrt(math.pi / 2)


class TuningError(QuasarError, RuntimeError):
    """The fork's tuning could not be read or committed; the message says why."""


@dataclasses.dataclass
class SweepResult:
    """One configuration's evaluation: tokens/sec per length (None where it did not pass) and the
    relative standard error of each median (None where unknown); ``current``: the fork's own tuning."""

    tuning: dict
    passed: bool
    tokens_per_sec: dict[int, float | None]
    reasons: list[str]
    noise: dict[int, float | None] = dataclasses.field(default_factory=dict)
    device: str = "cuda"
    device_name: str = ""
    current: bool = False

    @property
    def target_rate(self) -> float | None:
        """Tokens/sec at the longest length, the target."""
        return self.tokens_per_sec[max(self.tokens_per_sec)]


@dataclasses.dataclass(frozen=True)
class Choice:
    """What the sweep's figures support: ``best`` to write into the fork (None: keep its tuning),
    ``fastest`` the passing configuration fastest at the target, and ``why`` in a sentence."""

    best: SweepResult | None
    fastest: SweepResult | None
    why: str


def parse_grid(text: str) -> list[dict]:
    """A JSON list of tunable dicts, each checked against the contract; ValueError says which entry is bad."""
    try:
        grid = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--grid is not valid JSON: {error}") from None
    if not isinstance(grid, list) or not grid:
        raise ValueError("--grid must be a non-empty JSON list of objects")
    contract = tuning_contract()
    for index, entry in enumerate(grid):
        contract.parse_tuning(entry, f"--grid entry {index}")
    return grid


def current_tuning(repo: Path) -> dict:
    """The fork's ``tuning.json`` as a dict ({} when it has none); TuningError when it is not valid."""
    path = repo / TUNING_PATH
    if not path.exists():
        return {}
    try:
        tuning = json.loads(path.read_text())
        tuning_contract().parse_tuning(tuning, str(path))
    except (ValueError, TypeError) as error:
        raise TuningError(f"the fork's tuning is not valid ({error}): fix or remove {path}") from None
    return tuning


def runs_alike(tuning: dict, other: dict, device_name: str) -> bool:
    """Whether the chip named ``device_name`` runs both tunings with the same values."""
    contract = tuning_contract()
    chip = device_name or None
    return contract.parse_tuning(tuning, device=chip) == contract.parse_tuning(other, device=chip)


def evaluate_tuning(repo: Path, tuning: dict, seq_lens: tuple[int, ...], options, scratch: Path) -> SweepResult:
    """Evaluate the fork with ``tuning`` written into a scratch copy of it."""
    copy = scratch / "fork"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    (copy / TUNING_PATH).write_text(json.dumps(tuning, indent=1) + "\n")
    target = max(seq_lens)
    others = tuple(length for length in seq_lens if length != target)
    report = evaluate(copy, target, None, dataclasses.replace(options, seq_lens=others))
    speeds: dict[int, float | None] = {}
    noise: dict[int, float | None] = {}
    for length in seq_lens:
        item = report.lengths.get(str(length))
        if item is None or item.status != OK or not item.correct or not item.tokens_per_sec:
            speeds[length] = noise[length] = None
            continue
        speeds[length] = item.tokens_per_sec
        known = item.cv is not None and item.timed_runs > 0
        noise[length] = _MEDIAN_ERROR * item.cv / math.sqrt(item.timed_runs) if item.cv is not None and known else None
    return SweepResult(tuning, report.passed, speeds, list(report.reasons), noise, report.device, report.device_name)


def noise_margin(result: SweepResult, other: SweepResult) -> float:
    """The relative gain at the target below which ``result`` and ``other`` cannot be told apart:
    the run-to-run bound, or twice the combined standard error of their two medians if larger."""
    target = max(result.tokens_per_sec)
    errors = [result.noise.get(target), other.noise.get(target)]
    if any(error is None for error in errors):
        return RUN_TO_RUN
    return max(RUN_TO_RUN, 2 * math.hypot(*(error or 0.0 for error in errors)))


def choose(results: list[SweepResult]) -> Choice:
    """The configuration the figures support writing: the fastest passing one at the target, when
    it beats the current tuning by more than :func:`noise_margin`, on a GPU."""
    passing = [r for r in results if r.passed and r.target_rate]
    if not passing:
        return Choice(None, None, "no configuration passed: the fork's tuning stays as it is")
    fastest = max(passing, key=lambda r: r.target_rate or 0.0)
    target = f"T={length_label(max(fastest.tokens_per_sec))}"
    if not fastest.device.startswith("cuda"):
        where = "the CPU" if fastest.device == "cpu" else f"device {fastest.device}"
        return Choice(
            None,
            fastest,
            f"no CUDA: these figures come from {where}, where Triton's "
            "interpreter runs the kernels; its timings say nothing about a GPU and "
            "cannot separate the configurations. The fork's tuning stays as it is: "
            "run step 2 on the GPU you mine with.",
        )
    current = next((r for r in results if r.current), None)
    if current is None or not current.passed or not current.target_rate:
        return Choice(
            fastest,
            fastest,
            f"the current tuning did not pass at {target}: the fastest passing configuration replaces it",
        )
    if fastest is current:
        return Choice(None, fastest, f"the current tuning is the fastest at {target}: nothing to change")
    gain = fastest.target_rate / current.target_rate - 1  # type: ignore[operator]
    margin = noise_margin(fastest, current)
    if gain <= margin:
        return Choice(
            None,
            fastest,
            f"the fastest, {describe(fastest.tuning)}, is {gain:.1%} faster than the "
            f"current tuning at {target}, within the measurement noise (±{margin:.1%}): "
            "the figures cannot separate them. The fork's tuning stays as it is.",
        )
    return Choice(
        fastest,
        fastest,
        f"{describe(fastest.tuning)} is {gain:.1%} faster than the current tuning at {target} (noise ±{margin:.1%})",
    )


def describe(tuning: dict) -> str:
    """``key=value, …`` of a tuning, sorted; ``defaults`` for an empty one."""
    return ", ".join(f"{k}={v}" for k, v in sorted(tuning.items())) or "defaults"


def varying_tunables(results: list[SweepResult]) -> tuple[list[str], list[dict]]:
    """The tunables whose values differ among ``results`` on their chip (all named ones when
    none differ), and each result's values of them."""
    contract = tuning_contract()
    chip = next((r.device_name for r in results if r.device_name), "") or None
    values = [dataclasses.asdict(contract.parse_tuning(r.tuning, device=chip)) for r in results]
    named = sorted({key for r in results for key in r.tuning if key != "devices"})
    keys = [key for key in (values[0] if values else {}) if len({repr(v[key]) for v in values}) > 1] or named
    return keys, [{key: v[key] for key in keys} for v in values]


def short_label(values: dict) -> str:
    """A configuration by the values that set it apart: ``segment_chunks=16 wy_warps=1``."""
    return " ".join(f"{key}={value}" for key, value in values.items()) or "defaults"


def verdict_of(result: SweepResult, choice: Choice) -> str:
    """A row's verdict: best (written with --commit), fastest (not separable from the current
    tuning, or not on a GPU), pass or fail."""
    if not result.passed:
        return "fail"
    return "best" if result is choice.best else "fastest" if result is choice.fastest else "pass"


def length_label(length: int) -> str:
    """``1M``, ``64k``, ``65,536``: a sequence length as short as it stays exact."""
    for scale, suffix in ((1_000_000, "M"), (1000, "k")):
        if length % scale == 0:
            return f"{length // scale}{suffix}"
    return f"{length:,}"


def gain_label(rate: float, current: float) -> str:
    """``rate`` against the current tuning's in at most 7 characters (the width of "current"):
    ``+12.3%`` below ten times, ``259x`` from there (a percentage of five digits widened the
    column until a tunable's value wrapped)."""
    ratio = rate / current
    if ratio < 10:
        return f"{ratio - 1:+.1%}"
    return f"{ratio:.0f}x" if ratio < 1e6 else f"{ratio:.0e}x"


def render_table(results: list[SweepResult], choice: Choice) -> Table:
    """Tokens/sec per configuration and length, laid out for 80 columns: a column per tunable
    that differs among the configurations, one per length, the gain over the current tuning at
    the target, the verdict."""
    lengths = sorted(results[0].tokens_per_sec)
    keys, values = varying_tunables(results)
    current = next((r.target_rate for r in results if r.current), None)
    # No padding: the box's one space between columns is enough, and the tunables and three lengths fit 80.
    table = compact_table("tokens/sec (M = 10^6, k = 10^3)", padding=0)
    for key in keys:
        numbers = all(isinstance(v[key], int) and not isinstance(v[key], bool) for v in values)
        table.add_column(key.replace("_", "\n"), justify="right" if numbers else "left", overflow="fold")
    for length in lengths:
        table.add_column(length_label(length), justify="right", no_wrap=True)
    table.add_column(f"vs\ncurrent\nat {length_label(max(lengths))}", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for result, shown in zip(results, values, strict=True):
        cells = [compact_rate(result.tokens_per_sec[n]) for n in lengths]
        gain = gain_label(result.target_rate, current) if current and result.target_rate else "-"
        table.add_row(
            *(str(shown[key]) for key in keys),
            *cells,
            "current" if result.current else gain,
            verdict_of(result, choice),
        )
    return table


# The configurations the plot draws in colour besides the current tuning (the rest thin and grey):
# one colour and marker each, so every line is told apart.
PLOT_HIGHLIGHTS = 6
_PLOT_STYLES = [
    ("tab:blue", "o"),
    ("tab:orange", "^"),
    ("tab:green", "D"),
    ("tab:red", "v"),
    ("tab:purple", "P"),
    ("tab:brown", "X"),
]


def save_plot(results: list[SweepResult], choice: Choice, path: Path) -> None:
    """Two panels (PNG): tokens/sec against sequence length for the current tuning (black, dashed)
    and the :data:`PLOT_HIGHLIGHTS` fastest configurations at the target, each its own colour and
    marker, the others thin and grey; and every passing configuration at the target, fastest on
    top, with the band around the current tuning that the figures cannot separate from it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, values = varying_tunables(results)
    labels = {
        id(r): short_label(v) + (" (current)" if r.current else "") + (" (best)" if r is choice.best else "")
        for r, v in zip(results, values, strict=True)
    }
    # Only configurations that passed are drawn: the table lists the others.
    ranked = sorted(
        (r for r in results if r.passed and r.target_rate), key=lambda r: r.target_rate or 0.0, reverse=True
    )
    shown = [r for r in ranked if not r.current][:PLOT_HIGHLIGHTS]
    styles = {id(r): style for r, style in zip(shown, _PLOT_STYLES, strict=False)}
    grey = [r for r in ranked if id(r) not in styles and not r.current]
    top = max((r.target_rate or 0.0 for r in ranked), default=0.0)
    scale, unit = (1e6, "M") if top >= 1e6 else (1e3, "k")
    lengths = sorted(results[0].tokens_per_sec)
    figure, (lines, bars) = plt.subplots(1, 2, figsize=(15, 7.5), width_ratios=(1, 1.2), layout="constrained")
    # The legend lists the current tuning, the highlighted ones fastest first, then the grey ones,
    # which are drawn underneath.
    for result in [r for r in ranked if r.current] + shown + grey:
        xs, ys = zip(*sorted((n, v / scale) for n, v in result.tokens_per_sec.items() if v), strict=True)
        if result.current:
            lines.plot(
                xs, ys, color="black", linestyle="--", linewidth=2.4, marker="s", label=labels[id(result)], zorder=4
            )
        elif id(result) in styles:
            colour, marker = styles[id(result)]
            lines.plot(xs, ys, color=colour, marker=marker, linewidth=1.6, label=labels[id(result)], zorder=3)
        else:
            lines.plot(
                xs,
                ys,
                color="0.78",
                linewidth=0.8,
                zorder=1,
                label=f"{len(grey)} others (grey)" if result is grey[0] else None,
            )
    lines.set_xscale("log")
    lines.set_xticks(lengths, [length_label(n) for n in lengths])
    lines.minorticks_off()
    lines.set(xlabel="sequence length T (tokens)", ylabel=f"{unit} tokens/sec", title="tokens/sec by length")
    lines.grid(True, alpha=0.3)
    lines.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)

    order = list(reversed(ranked))
    colours = ["black" if r.current else styles.get(id(r), ("0.7", ""))[0] for r in order]
    bars.barh(range(len(order)), [(r.target_rate or 0.0) / scale for r in order], color=colours)
    bars.set_yticks(range(len(order)), [labels[id(r)] for r in order], fontsize=7)
    current = next((r for r in ranked if r.current), None)
    if current is not None and choice.fastest is not None:
        rate = (current.target_rate or 0.0) / scale
        margin = noise_margin(choice.fastest, current)
        bars.axvspan(
            rate * max(1 - margin, 0.0),
            rate * (1 + margin),
            color="tab:gray",
            alpha=0.25,
            zorder=0,
            label=f"current ±{margin:.1%}: not separable from it",
        )
        bars.legend(fontsize=7, loc="lower right")
    bars.set(xlabel=f"{unit} tokens/sec", title=f"at the target T={length_label(max(lengths))}")
    bars.grid(True, axis="x", alpha=0.3)
    on_gpu = results[0].device.startswith("cuda")
    chip = results[0].device_name if on_gpu and results[0].device_name else results[0].device.upper()
    figure.suptitle(
        f"QuasarAttention layer forward on {chip}"
        + ("" if on_gpu else ": no CUDA, these timings say nothing about a GPU")
    )
    figure.savefig(path, dpi=120)
    plt.close(figure)


def commit_tuning(repo: Path, tuning: dict, message: str) -> None:
    """Write ``tuning`` as the fork's ``tuning.json`` and commit that file alone; on a failure the
    file is put back and TuningError says what git answered."""
    path = repo / TUNING_PATH
    before = path.read_bytes() if path.exists() else None
    path.write_text(json.dumps(tuning, indent=1) + "\n")
    for args in (["add", "--", str(TUNING_PATH)], ["commit", "-q", "-m", message, "--", str(TUNING_PATH)]):
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["git", "reset", "-q", "--", str(TUNING_PATH)], cwd=repo, capture_output=True)
            if before is None:
                path.unlink()
            else:
                path.write_bytes(before)
            raise TuningError(
                f"git {args[0]} failed in {repo}: {(done.stderr or done.stdout).strip()}; "
                "the fork's tuning.json is unchanged"
            )


def default_out(repo: Path) -> Path:
    """Where the plot and the results go by default: ``FORK-tuning`` beside the fork."""
    return repo.with_name(f"{repo.name}-tuning")


def sweep(repo: Path, grid: list[dict], seq_lens: tuple[int, ...], options, console: Console) -> list[SweepResult]:
    """The current tuning, then every grid configuration the chip does not run exactly as it, evaluated
    with a progress bar. Raises EvaluationInputError for bad evaluation arguments."""
    current = current_tuning(repo)
    results: list[SweepResult] = []
    with tempfile.TemporaryDirectory(prefix="quasar-tuning-") as scratch:
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("current tuning", total=len(grid) + 1)
            results.append(
                dataclasses.replace(evaluate_tuning(repo, current, seq_lens, options, Path(scratch)), current=True)
            )
            progress.advance(task)
            for tuning in grid:
                if runs_alike(tuning, current, results[0].device_name):
                    progress.advance(task)
                    continue
                progress.update(task, description=describe(tuning))
                results.append(evaluate_tuning(repo, tuning, seq_lens, options, Path(scratch)))
                progress.advance(task)
    return results


def main(argv: Sequence[str] | None = None, prog: str = "quasar step2") -> int:
    """Step 2; exit status 0 when a configuration passed, 1 when none did, 2 for bad arguments or a failed commit."""
    parser = WrappingParser(
        prog=prog, description="Step 2 for a miner: tune the QuasarAttention kernel's tunables on this GPU."
    )
    parser.add_argument("--repo-path", type=Path, required=True, help="the fork (after step 1), checked out")
    parser.add_argument(
        "--seq-lens",
        type=parse_seq_lens,
        default=DEFAULT_SEQ_LENS,
        metavar="LIST",
        help=f"lengths to time; the longest is the target (default {format_seq_lens(DEFAULT_SEQ_LENS)})",
    )
    parser.add_argument("--grid", default=None, metavar="JSON", help="configurations to try (JSON list of objects)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"folder for {PLOT_NAME} and {RESULTS_NAME} (default: FORK-tuning beside the fork)",
    )
    parser.add_argument(
        "--commit",
        action="store_true",
        help="write the chosen configuration into the fork's tuning.json and commit it "
        "(without it, only show what would be written)",
    )
    add_evaluation_arguments(parser)
    args, settings = start(parser, argv)
    repo = args.repo_path.expanduser().resolve()
    if not (repo / "fla" / "ops" / "quasar" / "tuning.py").is_file():
        parser.error(f"{repo} has no fla/ops/quasar/tuning.py: run quasar step1 first")
    try:
        grid = parse_grid(args.grid) if args.grid else DEFAULT_GRID
    except ValueError as error:
        parser.error(str(error))
    console = Console()
    try:
        results = sweep(repo, grid, tuple(args.seq_lens), options_from(args, (), settings), console)
    except EvaluationInputError as error:
        parser.error(refusal(error, "--seq-lens LIST"))
    except TuningError as error:
        parser.error(str(error))
    choice = choose(results)
    console.print(render_table(results, choice))
    for result in results:
        for reason in result.reasons if not result.passed else ():
            console.print(f"  {escape(describe(result.tuning))}: {escape(reason)}")
    out = (args.out.expanduser() if args.out else default_out(repo)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    save_plot(results, choice, out / PLOT_NAME)
    (out / RESULTS_NAME).write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1) + "\n")
    # Paths and commands whole on their lines (soft_wrap), to be copied.
    console.print(f"plot: {out / PLOT_NAME}\nresults: {out / RESULTS_NAME}", soft_wrap=True)
    console.print(escape(choice.why), style="red" if choice.fastest is None else None)
    if choice.fastest is None:
        return 1
    if choice.best is None:
        return 0
    text = json.dumps(choice.best.tuning, indent=1)
    if not args.commit:
        console.print(
            f"without --commit nothing was written; --commit would write {repo / TUNING_PATH}:",
            escape(text),
            "and commit it. To check it against the current tuning once more and "
            f"commit it: {prog} --repo-path {repo} --grid '{json.dumps([choice.best.tuning])}' --commit",
            sep="\n",
            soft_wrap=True,
        )
        return 0
    try:
        commit_tuning(repo, choice.best.tuning, f"Kernel tuning: {describe(choice.best.tuning)}")
    except TuningError as error:
        console.print(f"[red]{escape(str(error))}[/red]")
        return 2
    console.print(f"wrote and committed {repo / TUNING_PATH}", soft_wrap=True)
    return 0
