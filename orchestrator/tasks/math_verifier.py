"""Math answers: extract the final ``\\boxed{...}`` and decide whether it equals the truth.

``answers_match`` tries, cheapest first: equal strings after normalisation, exact numeric
comparison (integers, decimals, fractions), then symbolic comparison with sympy. The
symbolic step only ever sees text produced by this module's own LaTeX converter (a small
whitelist), and it runs in a separate worker process that is killed when a check overruns
its time limit, since sympy can take unbounded time and memory on tiny inputs (9^{9^{9}}).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import select
import signal
import subprocess
import sys
import threading
from fractions import Fraction
from typing import Any

# Longer answers are not worth normalising, let alone handing to sympy.
MAX_ANSWER_CHARS = 1000
RELATIVE_TOLERANCE = Fraction(1, 10**9)

_THINK_END = "</think>"


def extract_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` after the last ``</think>``, or None."""
    final = text.rpartition(_THINK_END)[2]  # all of it when there is no </think>
    start = final.rfind("\\boxed")
    while start != -1:
        content = _braced_after(final, start + len("\\boxed"))
        if content is not None:
            return content
        if _opens_group(final, start + len("\\boxed")):
            return None  # the last box was cut off: the model gave no complete answer
        start = final.rfind("\\boxed", 0, start)  # "\\boxeds" and the like are not boxes
    return None


def _opens_group(text: str, i: int) -> bool:
    while i < len(text) and text[i].isspace():
        i += 1
    return i < len(text) and text[i] == "{"


def _braced_after(text: str, i: int) -> str | None:
    """The content of the brace group starting at ``text[i:]`` (after spaces), or None."""
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2  # \{ and \} are literal braces, not grouping
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def verify_math(completion: str, verification_info: dict[str, Any], timeout_s: float = 2.0) -> bool:
    """Whether the completion's boxed final answer equals ``verification_info["ground_truth"]``."""
    if not isinstance(verification_info, dict):
        raise ValueError("math verification_info must be an object")
    truth = verification_info.get("ground_truth")
    if isinstance(truth, int | float) and not isinstance(truth, bool):
        truth = str(truth)
    if not isinstance(truth, str) or not truth.strip():
        raise ValueError("math verification_info needs a non-empty string 'ground_truth'")
    answer = extract_answer(completion)
    return answer is not None and answers_match(answer, truth, timeout_s)


def answers_match(candidate: str, ground_truth: str, timeout_s: float = 2.0) -> bool:
    """Whether two answers are equivalent; a symbolic check that overruns ``timeout_s`` is not."""
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
    if len(candidate) > MAX_ANSWER_CHARS or len(ground_truth) > MAX_ANSWER_CHARS:
        return False
    a, b = normalize_answer(candidate), normalize_answer(ground_truth)
    if not a or not b:
        return False
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    if x is not None and y is not None:
        return abs(x - y) <= RELATIVE_TOLERANCE * max(abs(x), abs(y))
    try:
        sa, sb = latex_to_sympy(a), latex_to_sympy(b)
    except ValueError:
        return False
    return sa == sb or _WORKER.equal(sa, sb, timeout_s)


# --- normalisation ------------------------------------------------------------------------

_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\s*(?=\{)")
_DROPPED = re.compile(r"\\(?:left|right)(?![a-zA-Z])|\\[!,;:> ]|~")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac(?![a-zA-Z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_PERCENT = re.compile(r"\\?%$")
_ASSIGNMENT = re.compile(r"[a-zA-Z](?:_\{?[a-zA-Z0-9]+\}?)?=")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# A space matters only between two letters ("\pi r"); everywhere else it is layout.
_LAYOUT_SPACE = re.compile(r"(?<![a-zA-Z]) | (?![a-zA-Z])")


def normalize_answer(answer: str) -> str:
    """The answer with layout, wrappers and notational variants removed."""
    s = _unwrap_text(answer).replace("\\$", "").replace("$", "")
    s = _DROPPED.sub(" ", s)
    s = _FRAC_VARIANTS.sub(r"\\frac", s)
    s = _DEGREES.sub("", s)
    s = _LAYOUT_SPACE.sub("", " ".join(s.split()))
    s = s.rstrip(".")
    s = _PERCENT.sub("", s)
    if s.count("=") == 1 and (m := _ASSIGNMENT.match(s)):
        s = s[m.end() :]
    s = s.replace("{,}", ",")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    while s.startswith("{") and _braced_after(s, 0) == s[1:-1]:
        s = s[1:-1]
    return s


def _unwrap_text(s: str) -> str:
    """``\\text{km}`` -> ``km``; last match first, so earlier match positions stay valid."""
    for m in reversed(list(_TEXT_COMMANDS.finditer(s))):
        inner = _braced_after(s, m.end())
        if inner is not None:
            s = s[: m.start()] + inner + s[m.end() + len(inner) + 2 :]
    return s


_DECIMAL = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN_NUMBER = re.compile(_DECIMAL)
_SLASH_FRACTION = re.compile(rf"({_DECIMAL})/(\d+(?:\.\d*)?)")
_LATEX_FRACTION = re.compile(rf"([+-]?)\\frac(?:\{{({_DECIMAL})\}}\{{({_DECIMAL})\}}|(\d)(\d))")


def _as_number(s: str) -> Fraction | None:
    """The exact value of a plain number or a numeric fraction, else None."""
    if _PLAIN_NUMBER.fullmatch(s):
        return Fraction(s)
    if m := _SLASH_FRACTION.fullmatch(s):
        num, den = Fraction(m.group(1)), Fraction(m.group(2))
        return num / den if den else None
    if m := _LATEX_FRACTION.fullmatch(s):
        num = Fraction(m.group(2) or m.group(4))
        den = Fraction(m.group(3) or m.group(5))
        if not den:
            return None
        return -num / den if m.group(1) == "-" else num / den
    return None


# --- LaTeX to sympy syntax ----------------------------------------------------------------

_TOKEN = re.compile(r"\\[a-zA-Z]+|\\[{}]|\d+(?:\.\d+)?|\.\d+|[a-zA-Z]|[-+*/^()\[\]{}]|\s+|.")
_CONSTANTS = {"\\pi": "pi", "\\infty": "oo"}
_OPERATORS = {"+": "+", "-": "-", "*": "*", "/": "/", "\\cdot": "*", "\\times": "*", "\\div": "/"}
_FUNCTIONS = {
    "\\sin": "sin",
    "\\cos": "cos",
    "\\tan": "tan",
    "\\ln": "log",
    "\\log": "log",
    "\\exp": "exp",
}
_CLOSING = {"(": ")", "[": "]", "{": "}"}


def latex_to_sympy(latex: str) -> str:
    """Sympy syntax for a small LaTeX subset; ValueError for anything outside it.

    The output holds only numbers, single-letter names, whitelisted function names,
    arithmetic operators, parentheses and commas, so sympy never parses anything it was not
    meant to: implicit products ("2\\sqrt{2}", "3x") become explicit here.
    """
    try:
        return _LatexReader(latex).read()
    except ValueError as e:
        raise ValueError(f"not in the supported LaTeX subset: {e}") from None


# Deeper nesting than this is no answer anyone writes; it would only exhaust the stack.
_MAX_DEPTH = 50


class _LatexReader:
    def __init__(self, latex: str) -> None:
        self.tokens = [t for t in _TOKEN.findall(latex) if not t.isspace()]
        self.i = 0
        self.depth = 0

    def read(self) -> str:
        out = self._sequence(None)
        if self.i != len(self.tokens):
            raise ValueError(f"unbalanced {self.tokens[self.i]!r}")
        return out

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self) -> str:
        tok = self._peek()
        if tok is None:
            raise ValueError("the expression ends too early")
        self.i += 1
        return tok

    def _sequence(self, end: str | None) -> str:
        parts: list[str] = []
        after_operand = False
        while (tok := self._peek()) is not None and tok != end:
            if tok in _OPERATORS:
                self.i += 1
                parts.append(_OPERATORS[tok])
                after_operand = False
            elif tok == "^":
                if not after_operand:
                    raise ValueError("an exponent needs a base")
                self.i += 1
                parts.append(f"**({self._argument()})")
            else:
                if after_operand:
                    parts.append("*")
                parts.append(self._operand())
                after_operand = True
        if not parts or parts[-1] in _OPERATORS.values():
            raise ValueError("an operand is missing")
        return "".join(parts)

    def _operand(self) -> str:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise ValueError("nested too deeply")
        try:
            return self._operand_at(self._take())
        finally:
            self.depth -= 1

    def _operand_at(self, tok: str) -> str:
        if tok[0].isdigit() or tok[0] == ".":
            return _number(tok)
        if len(tok) == 1 and tok.isalpha():
            return tok
        if tok in _CLOSING:
            inner = self._sequence(_CLOSING[tok])
            self._take()
            return f"({inner})"
        if tok in _CONSTANTS:
            return _CONSTANTS[tok]
        if tok == "\\frac":
            return f"(({self._argument()})/({self._argument()}))"
        if tok == "\\sqrt":
            if self._peek() == "[":
                self.i += 1
                index = self._sequence("]")
                self._take()
                return f"root({self._argument()},{index})"
            return f"sqrt({self._argument()})"
        if tok in _FUNCTIONS:
            return f"{_FUNCTIONS[tok]}({self._argument()})"
        raise ValueError(f"unsupported {tok!r}")

    def _argument(self) -> str:
        """A command's argument: a group, or a single token ("\\frac12", "x^2")."""
        tok = self._peek()
        if tok is not None and tok[0].isdigit() and len(tok) > 1:
            # LaTeX takes one character: x^23 is x^2 * 3.
            self.tokens[self.i] = tok[1:]
            return tok[0]
        if tok in _OPERATORS or tok == "^":
            raise ValueError(f"unsupported argument {tok!r}")
        return self._operand()


def _number(tok: str) -> str:
    """Decimals as exact ratios, so that 0.1 and 1/10 are the same number to sympy."""
    whole, _, frac = tok.partition(".")
    if not frac:
        return str(int(whole or "0"))
    return f"({int(whole + frac)}/{10 ** len(frac)})"


# --- the symbolic worker ------------------------------------------------------------------

# Generous: the first check pays for starting Python and importing sympy, which is not the
# candidate's fault and must not count against its time limit.
_STARTUP_TIMEOUT_S = 120.0
# sympy itself needs a few hundred MiB; past this a check is pathological.
_WORKER_MEMORY_BYTES = 2 << 30


class _SymbolicWorker:
    """One persistent sympy process, reused across checks, replaced when a check overruns.

    A plain subprocess speaking JSON lines, not multiprocessing: a spawned child would
    re-import the caller's main module (torch and all, or a script without a main guard).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    def equal(self, a: str, b: str, timeout_s: float) -> bool:
        with self._lock:
            process = self._running()
            try:
                process.stdin.write(json.dumps([a, b]).encode() + b"\n")
                process.stdin.flush()
                answer = _read_line(process, timeout_s)
            except OSError:
                answer = None  # the worker died mid-check (e.g. out of memory): not a match
            if answer is None:
                self._discard()
                return False
            return answer == b"1\n"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._discard()
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        if _read_line(self._process, _STARTUP_TIMEOUT_S) != b"ready\n":
            self._discard()
            raise RuntimeError("the sympy worker process did not start")
        return self._process

    def _discard(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for pipe in (self._process.stdin, self._process.stdout):
                pipe.close()
        self._process = None


def _read_line(process: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
    """One reply line, or None if none came within the time limit or the worker died."""
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    if not ready:
        return None
    return process.stdout.readline() or None


_WORKER = _SymbolicWorker()
_WORKER_CODE = "from orchestrator.tasks.math_verifier import serve_worker; serve_worker()"


def _die_with_parent() -> None:
    """A worker deep in sympy when its parent dies would spin on, orphaned, for minutes."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)


def serve_worker() -> None:
    """The worker's loop: a JSON ``[a, b]`` per line in, ``1`` or ``0`` per line out."""
    import resource

    _die_with_parent()
    with contextlib.suppress(ValueError, OSError):  # some platforms have no RLIMIT_AS
        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY_BYTES, _WORKER_MEMORY_BYTES))
    _symbolic_equal("x", "x")  # import and warm sympy before saying ready
    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        try:
            a, b = json.loads(line)
            result = _symbolic_equal(a, b)
        except Exception:
            result = False  # whatever sympy cannot decide is not a match
        out.write(b"1\n" if result else b"0\n")
        out.flush()


def _symbolic_equal(a: str, b: str) -> bool:
    import sympy
    from sympy.parsing.sympy_parser import auto_number, auto_symbol, parse_expr

    # Only what latex_to_sympy emits; no builtins, so nothing else resolves.
    names: dict[str, Any] = {
        "__builtins__": {},
        "Integer": sympy.Integer,
        "Symbol": sympy.Symbol,
        "sqrt": sympy.sqrt,
        "root": sympy.root,
        "pi": sympy.pi,
        "oo": sympy.oo,
        "sin": sympy.sin,
        "cos": sympy.cos,
        "tan": sympy.tan,
        "log": sympy.log,
        "exp": sympy.exp,
    }
    ea, eb = (
        parse_expr(s, local_dict={}, global_dict=names, transformations=(auto_symbol, auto_number))
        for s in (a, b)
    )
    if any(e.has(sympy.zoo, sympy.nan) for e in (ea, eb)):
        return False  # 1/0 equals nothing, least of all another division by zero
    diff = sympy.simplify(ea - eb)
    if diff == 0:
        return True
    if diff.free_symbols:
        return False
    # simplify misses some identities between constants; their values do not.
    gap, scale = (abs(sympy.N(e, 30)) for e in (diff, sympy.Max(abs(ea), abs(eb))))
    if not (gap.is_finite and scale.is_finite):
        return False
    return bool(gap <= sympy.Float(1e-9) * scale)
