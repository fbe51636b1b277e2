"""`boltbeam generate`: text in, text out, through a route (or none), streamed as it decodes."""
from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

from boltbeam import report, switches
from boltbeam.errors import BadInput

# The JIT captures on the second decode call: the tokens before the third carry compile time, not decode.
CAPTURED_AFTER = 2
# tinygrad.llm's tokenizer merges each word's bytes in time that grows with the square of its length (4,000
# letters take seconds, 16,000 a minute): a prompt's runs of one kind of character are held to this many.
LONGEST_RUN = 256
_RUNS = re.compile(r"[^\W\d_]+|\s+|(?:[^\w\s]|_)+")     # letters; spaces; neither letters, digits nor spaces


def register(sub: argparse._SubParsersAction) -> None:
    from boltbeam.cli.read import model_arg
    p = sub.add_parser("generate", help="text in, text out: the model decodes a prompt greedily, through a route or none",
                       description="Encodes the prompt with the file's own vocabulary (tinygrad.llm's tokenizer), "
                                   "decodes greedily with the route's families and kernel choices, streams the text "
                                   "to stdout and says the decode rate on stderr. With and without a route the greedy "
                                   "text is the same: a route changes how fast, never what.")
    model_arg(p)
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-tokens", type=int, default=32, metavar="N", help="tokens to generate at most (default 32)")
    p.add_argument("--route", metavar="ROUTE.json", help="a route file (`none`, or BOLTBEAM_ROUTE=none: tinygrad's own)")
    p.add_argument("--device", choices=["CPU", "CUDA"], default="CPU", help="tinygrad device (default CPU)")
    p.add_argument("--json", action="store_true", help="print one JSON record at the end instead of streaming")
    p.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from boltbeam.cli.depth import MOST_POSITIONS
    from boltbeam.cli.read import resolve_model
    from boltbeam.read.census import take_census
    from boltbeam.route import use
    if not args.prompt.strip():
        raise BadInput("--prompt is empty: give the text to continue")
    if args.max_tokens < 1:
        raise BadInput(f"--max-tokens must be at least 1, not {args.max_tokens}")
    model = resolve_model(args)
    census = take_census(model)
    limit = census.facts.context_length or MOST_POSITIONS
    kv = use.tokenizer_kv(model)
    _check_prompt(args.prompt, max(map(len, kv.get("tokenizer.ggml.tokens") or [""])) or 1, limit)
    switches.DEV.set(args.device)     # tinygrad reads its device when first imported: before the tokenizer's import
    from boltbeam.measure.tinygrad_run import open_device
    open_device(args.device)            # a machine without it is one line here, before anything loads
    tokenizer = use.tokenizer_of(kv)
    try:
        ids = tokenizer[0].prefix() + tokenizer[0].encode(args.prompt)
    except RuntimeError:      # tinygrad.llm's tokenizer: a piece its vocabulary cannot spell
        raise BadInput("the prompt holds text the model's vocabulary cannot spell") from None
    if len(ids) + args.max_tokens > limit:
        whose = "the model's context length" if census.facts.context_length else "the most BoltBeam runs"
        raise BadInput(f"the prompt's {len(ids):,} tokens and --max-tokens {args.max_tokens:,} exceed {whose}, "
                       f"{limit:,} positions")
    with contextlib.ExitStack() as inside:
        with report.console().status("loading the model and building the route"):
            routed = inside.enter_context(use.load(model, args.route, positions=len(ids) + args.max_tokens + 1,
                                                   tokenizer=tokenizer))
        decoded = _decode(routed, ids, args.max_tokens, stream=not args.json)
    if args.json:
        report.print_json(decoded.to_dict())
    else:
        rate = f"{decoded.tok_s:,.1f} tok/s decoding" if decoded.tok_s else "too few tokens to time the decode"
        print(f"\n[{len(decoded.tokens)} tokens, {rate}; route: {decoded.route}]", file=sys.stderr)
        for note in decoded.notes:
            print(f"note: {note}", file=sys.stderr)
    return 0


def _check_prompt(prompt: str, longest_token: int, limit: int) -> None:
    """Before the prompt is encoded: UTF-8 text (a byte that is not arrives as a lone surrogate), few enough
    bytes to fit `limit` tokens of at most `longest_token` bytes each, and no run longer than LONGEST_RUN."""
    try:
        size = len(prompt.encode())
    except UnicodeEncodeError as e:
        raise BadInput(f"--prompt is not UTF-8 text (at character {e.start:,})") from None
    if size > limit * longest_token:
        raise BadInput(f"--prompt's {size:,} bytes are more than {limit:,} positions hold (tokens of at most "
                       f"{longest_token} bytes)")
    if run := next((m for m in _RUNS.finditer(prompt) if m.end() - m.start() > LONGEST_RUN), None):
        raise BadInput(f"--prompt holds a run of {run.end() - run.start():,} characters of one kind from character "
                       f"{run.start():,}; tinygrad.llm's tokenizer splits at most {LONGEST_RUN} at once in bounded time")


@dataclass
class Decoded:
    prompt_tokens: list[int]
    tokens: list[int]
    text: str
    step_seconds: list[float]       # each generated token's wall, the first with the prompt's prefill
    route: str
    notes: list[str] = field(default_factory=list)

    @property
    def tok_s(self) -> float | None:
        """Tokens a second from the median step after the JIT captured; None with too few tokens."""
        steady = self.step_seconds[CAPTURED_AFTER:]
        return 1 / statistics.median(steady) if steady else None

    def to_dict(self) -> dict:
        return {**asdict(self), "tok_s": self.tok_s}


def _decode(routed, ids: list[int], max_tokens: int, stream: bool) -> Decoded:
    """Greedy tokens until the model ends its turn or max_tokens; the text streamed as it comes."""
    from boltbeam.route.use import label
    tok, pieces, tokens, steps = routed.tokenizer, [], [], []
    decode = tok.stream_decoder()
    gen = routed.net.generate(list(ids))
    while len(tokens) < max_tokens:
        t0 = time.perf_counter()
        token = next(gen)
        steps.append(time.perf_counter() - t0)
        if tok.is_end(token):
            break
        tokens.append(token)
        pieces.append(decode(token))
        if stream:
            sys.stdout.write(pieces[-1])
            sys.stdout.flush()
    pieces.append(decode())
    if stream:
        sys.stdout.write(pieces[-1] + "\n")
    notes = [*routed.notes, *(note for built in routed.built for note in built.notes)]
    return Decoded(list(ids), tokens, "".join(pieces), steps, label(routed), notes)
