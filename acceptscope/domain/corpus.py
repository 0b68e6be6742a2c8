"""Training and evaluation text for the reference engine, from sources any machine has or we generate.

Four workloads, built so that speculative-decoding acceptance depends on the workload the way it does for
real models (high on math and code, low on chat and verse):

* ``code``  - the running interpreter's standard library (source and docstrings): raw file chunks, and
  chat tasks "Write a python function to <docstring summary>" answered with the stdlib function;
* ``math``  - generated arithmetic word problems with fully worked, templated answers ending in
  ``\\boxed{n}`` (low entropy given the question);
* ``chat``  - generated assistant replies assembled from many random sentence templates and word lists
  (medium-high entropy);
* ``verse`` - generated poems whose lines pick words uniformly from large lists (highest entropy).

Everything is seeded; the word lists and templates are our own. No file is downloaded.
"""

from __future__ import annotations

import ast
import os
import random
import sysconfig
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from acceptscope.domain.chat import ASSISTANT_ROLE, PAD_TOKEN, USER_ROLE, format_chat

__all__ = [
    "WORKLOADS",
    "EVAL_WORKLOADS",
    "DEFAULT_MIX",
    "Doc",
    "build_corpus",
    "eval_prompts",
    "stdlib_files",
    "math_problem",
    "code_task",
    "chat_exchange",
    "verse_exchange",
    "MATH_SUFFIX",
]

WORKLOADS = ("math", "code", "chat", "verse")
EVAL_WORKLOADS = ("math", "code", "code-stdlib", "chat", "verse")
DEFAULT_MIX = {"code": 0.40, "math": 0.30, "chat": 0.15, "verse": 0.15}
MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
MATH_SCALES = (1, 3, 10)  # operand-range multipliers a math problem draws from
MATH_EXTRA_STEP = 0.5  # share of math problems with one more step on the result
HELDOUT_PERCENT = 5  # stdlib files whose path hash falls below this go to evaluation only


@dataclass(frozen=True)
class Doc:
    workload: str
    text: str


# --------------------------------------------------------------------------------------------------
# word lists (written for this project)

NAMES = ("Ava Ben Carla Dev Elena Farid Grace Hugo Iris Jonas Kira Liam Maya Noah Olga Priya Quinn Rosa Sam "
         "Tara Umar Vera Wes Xena Yusuf Zoe Aiden Bella Chen Dana Emil Fiona Gita Hana Ivan Jade Kofi Lena "
         "Marco Nadia Omar Paula Rafael Sofia Tomas Una Viktor Wanda").split()
FEMALE = set("Ava Carla Elena Grace Iris Kira Maya Olga Priya Rosa Tara Vera Xena Zoe Bella Dana Fiona Gita Hana "
             "Jade Lena Nadia Paula Sofia Una Wanda".split())
ITEMS = ("apple pencil notebook cookie sticker marble book ticket cupcake balloon candle shirt toy car plate "
         "flower lemon muffin card bottle").split()
ANIMALS = "hen duck goose quail".split()
PLACES = ("Lisbon Kyoto Nairobi Oslo Lima Hanoi Cairo Dublin Quebec Hawaii Patagonia Iceland Bali Vienna Seoul "
          "Marrakesh Tasmania Sicily Chile Norway Peru Morocco").split()
TOPICS = [
    "gardening", "cooking", "budgeting", "running", "sleep habits", "learning a language", "remote work",
    "time management", "public speaking", "photography", "meditation", "moving to a new city",
    "saving money", "job interviews", "baking bread", "team meetings", "writing essays",
    "studying for exams", "home workouts", "cycling to work", "houseplants", "decluttering a room",
    "starting a podcast", "negotiating a raise", "learning guitar", "planning a wedding", "adopting a dog",
    "hiking safely", "making friends as an adult", "reading more books",
]
ADJ = ("bright quiet gentle bold calm steady fresh clever simple careful patient curious warm honest quick "
       "sturdy subtle vivid modest eager lively useful practical small large early late flexible clear "
       "friendly serious playful thoughtful").split()
NOUNS = ("plan habit routine goal schedule budget note list idea question friend neighbor teacher colleague "
         "manager morning evening weekend project garden kitchen notebook journal window street market river "
         "library meeting letter story choice reason detail problem answer").split()
VERBS = ("start try keep build change check share write plan review practice track notice improve choose "
         "prepare finish explore organize measure simplify protect balance repeat compare").split()
ADVERBS = ("slowly gently often rarely carefully quickly quietly boldly honestly steadily patiently "
           "daily sometimes usually always").split()
CONNECT = ("Also, However, In practice, For example, Over time, Most of all, On busy days, In my experience, "
           "At first, Later, Surprisingly,").split(", ")

V_ADJ = ("silver golden hollow crimson silent ancient tender restless frozen burning wandering broken gentle "
         "velvet bitter sweet pale endless distant secret lonely shining wild drowsy amber misty scarlet "
         "fragile hungry weary radiant trembling forgotten starlit copper emerald iron salty lunar dusty "
         "paper glass quiet feral").split()
V_NOUN = ("moon river sparrow lantern ember tide meadow shadow orchard harbor thunder candle valley mirror "
          "willow feather ocean ash stone rain garden bell compass thread winter summer morning midnight "
          "cathedral desert fox raven clover smoke anchor cradle crown ribbon harp wheat spiral horizon "
          "island kettle letter ladder marrow needle oyster prairie quarry saddle tulip violin wolf").split()
V_VERB = ("whispers burns drifts sings trembles wanders breaks glows falls rises sleeps dances weeps waits "
          "shivers hums bends fades calls turns bleeds listens remembers forgets opens closes gathers "
          "scatters hides").split()
V_PREP = "beneath above beyond inside across along behind toward under over through among past within".split()
V_FORMS = ("poem", "short poem", "haiku", "sonnet", "song", "ballad", "limerick", "rap verse", "lullaby", "ode")
V_TOPICS = ("the sea", "autumn", "a lost key", "the city at night", "first snow", "an old friend",
            "a lighthouse", "the stars", "a train journey", "morning coffee", "a broken clock", "the desert",
            "a garden in spring", "rain on a tin roof", "a forgotten letter", "the moon", "a sleepy cat",
            "a mountain road", "the last day of summer", "a machine that dreams")


def _pron(name: str) -> tuple[str, str, str]:
    return ("She", "she", "her") if name in FEMALE else ("He", "he", "his")


# --------------------------------------------------------------------------------------------------
# math


def math_problem(rng: random.Random, scale: int | None = None) -> tuple[str, str]:
    """One word problem and its worked answer (worked steps, final ``\\boxed{n}``).

    Harder for the drafter than a fixed template, as real GSM8K is: operands of mixed magnitude (``scale``
    drawn from ``MATH_SCALES`` unless given: results the tiny pair cannot memorise), every worked step in one of
    two phrasings (a near-tie the target breaks its own way, which a parallel drafter can only guess), and
    ``MATH_EXTRA_STEP`` of the problems take one more step on the previous result.
    """
    kind = rng.randrange(7)
    name = rng.choice(NAMES)
    P, p, poss = _pron(name)
    m = int(scale) if scale else rng.choice(MATH_SCALES)

    def alt(*options: str) -> str:
        return rng.choice(options)

    if kind == 0:
        a = rng.randint(12 * m, 60 * m); b = rng.randint(1, 6 * m); c = rng.randint(1, 6 * m)
        price = rng.randint(2, 9 * m)
        animal = rng.choice(ANIMALS)
        q = (f"{name}'s {animal}s lay {a} eggs per day. {P} eats {b} for breakfast every morning and bakes with "
             f"{c} every day. {P} sells the rest for ${price} per egg. How much money does {p} make every day?")
        used, left = b + c, a - b - c
        ans = (alt(f"{name} uses {b} + {c} = {used} eggs every day.\n", f"Every day {p} uses {b} + {c} = {used} eggs.\n")
               + alt(f"So {p} has {a} - {used} = {left} eggs left to sell.\n",
                     f"That leaves {a} - {used} = {left} eggs to sell.\n")
               + alt(f"{P} makes {left} * {price} = {left * price} dollars every day.\n",
                     f"Selling them earns {left} * {price} = {left * price} dollars a day.\n"))
        final = left * price
    elif kind == 1:
        i1, i2 = rng.sample(ITEMS, 2)
        a = rng.randint(2, 12 * m); pa = rng.randint(1, 15 * m); b = rng.randint(2, 12 * m); pb = rng.randint(1, 15 * m)
        q = (f"{name} buys {a} {i1}s for ${pa} each and {b} {i2}s for ${pb} each. "
             f"How much does {p} spend in total?")
        ans = (alt(f"The {i1}s cost {a} * {pa} = {a * pa} dollars.\n", f"For the {i1}s {p} pays {a} * {pa} = {a * pa} dollars.\n")
               + alt(f"The {i2}s cost {b} * {pb} = {b * pb} dollars.\n", f"For the {i2}s {p} pays {b} * {pb} = {b * pb} dollars.\n")
               + alt(f"In total {p} spends {a * pa} + {b * pb} = {a * pa + b * pb} dollars.\n",
                     f"Together that is {a * pa} + {b * pb} = {a * pa + b * pb} dollars.\n"))
        final = a * pa + b * pb
    elif kind == 2:
        per = rng.randint(5, 40 * m); days = rng.randint(2, 14 * m); total = per * days + rng.randint(10, 200 * m)
        q = (f"{name} reads {per} pages every day. {P} is reading a book with {total} pages. "
             f"How many pages are left after {days} days?")
        ans = (alt(f"In {days} days {name} reads {per} * {days} = {per * days} pages.\n",
                   f"{name} reads {per} * {days} = {per * days} pages in {days} days.\n")
               + alt(f"The pages left are {total} - {per * days} = {total - per * days}.\n",
                     f"So {total} - {per * days} = {total - per * days} pages are left.\n"))
        final = total - per * days
    elif kind == 3:
        k = rng.randint(2, 9 * m); each = rng.randint(2, 15 * m); item = rng.choice(ITEMS)
        tot = k * each
        q = (f"{name} has {tot} {item}s and shares them equally among {k} friends. "
             f"How many {item}s does each friend get?")
        ans = alt(f"Each friend gets {tot} / {k} = {each} {item}s.\n", f"{tot} / {k} = {each}, so each friend gets {each}.\n")
        final = each
    elif kind == 4:
        price = rng.randint(2, 30 * m) * 10; pct = rng.choice([10, 20, 25, 50]); item = rng.choice(ITEMS)
        off = price * pct // 100
        q = f"A {item} costs ${price}. It is on sale for {pct}% off. What is the sale price in dollars?"
        ans = (alt(f"The discount is {price} * {pct} / 100 = {off} dollars.\n", f"{pct}% of {price} is {off} dollars.\n")
               + alt(f"The sale price is {price} - {off} = {price - off} dollars.\n",
                     f"So the {item} costs {price} - {off} = {price - off} dollars.\n"))
        final = price - off
    elif kind == 5:
        other = rng.choice([n for n in NAMES if n != name]); a = rng.randint(5, 40 * m); d = rng.randint(1, 15 * m)
        y = rng.randint(1, 10 * m)
        q = (f"{name} is {a} years old. {other} is {d} years older than {name}. "
             f"What will be the sum of their ages in {y} years?")
        b = a + d
        ans = (alt(f"{other} is {a} + {d} = {b} years old.\n", f"{other}'s age is {a} + {d} = {b}.\n")
               + alt(f"In {y} years {name} will be {a} + {y} = {a + y} and {other} will be {b} + {y} = {b + y}.\n",
                     f"After {y} years they will be {a} + {y} = {a + y} and {b} + {y} = {b + y}.\n")
               + f"The sum is {a + y} + {b + y} = {a + b + 2 * y}.\n")
        final = a + b + 2 * y
    else:
        a = rng.randint(2, 50 * m); b = rng.randint(2, 20 * m); c = rng.randint(2, 9 * m)
        q = f"What is {a} + {b} * {c}?"
        ans = alt(f"First multiply: {b} * {c} = {b * c}.\nThen add: {a} + {b * c} = {a + b * c}.\n",
                  f"Multiplication comes first: {b} * {c} = {b * c}.\nAdding {a} gives {a + b * c}.\n")
        final = a + b * c
    if rng.random() < MATH_EXTRA_STEP:  # one more step on the result: multi-step like GSM8K
        t = rng.randint(2, 4 * m + 2)
        if rng.random() < 0.5:
            q += f" Then multiply that by {t}."
            ans += alt(f"Multiplying by {t}: {final} * {t} = {final * t}.\n", f"Then {final} * {t} = {final * t}.\n")
            final *= t
        else:
            q += f" Then add {t} to that."
            ans += alt(f"Adding {t}: {final} + {t} = {final + t}.\n", f"Then {final} + {t} = {final + t}.\n")
            final += t
    ans += f"The answer is \\boxed{{{final}}}."
    return q + MATH_SUFFIX, ans


# --------------------------------------------------------------------------------------------------
# chat


# Chat nouns own a fixed "feeling" word used a few tokens later ("your <noun> will feel more <feeling>"):
# a second-order dependency the drafter can only guess when the noun was drafted in the same block.
_FEEL_RNG = random.Random(777)
FEEL_OF = {n: ADJ[_FEEL_RNG.randrange(len(ADJ))] for n in NOUNS}


def _sentence(rng: random.Random) -> str:
    t = rng.randrange(6)
    a, a2 = rng.choice(ADJ), rng.choice(ADJ)
    n, n2 = rng.choice(NOUNS), rng.choice(NOUNS)
    v, v2 = rng.choice(VERBS), rng.choice(VERBS)
    adv = rng.choice(ADVERBS)
    if t == 0:
        s = f"a {a} {n} helps you {v} your {n2} {adv}, and a {n2} feels {FEEL_OF[n2]}"
    elif t == 1:
        s = f"try to {v} one {a} {n} each {rng.choice(['day', 'week', 'morning', 'evening'])}"
    elif t == 2:
        s = f"it is {a} to {v} the {n} before you {v2} the {n2}"
    elif t == 3:
        s = f"many people {adv} {v} a {a2} {n} and then {v2} it"
    elif t == 4:
        s = f"your {n} feels {FEEL_OF[n]} and your {n2} feels {FEEL_OF[n2]} if you {v} {adv}"
    else:
        s = f"a {a} {n} and a {a2} {n2} can {v} together"
    if rng.random() < 0.35:
        s = f"{rng.choice(CONNECT)} {s}"
    return s[0].upper() + s[1:] + "."


def chat_exchange(rng: random.Random) -> tuple[str, str]:
    """A templated user request and a high-entropy assistant reply."""
    topic = rng.choice(TOPICS)
    u = rng.choice([
        f"Can you give me some advice about {topic}?",
        f"What do you think about {topic}?",
        f"I want to get better at {topic}. Where should I start?",
        f"Write a short email to my {rng.choice(['manager', 'friend', 'teacher', 'neighbor'])} about {topic}.",
        f"Compose a short blog post about a trip to {rng.choice(PLACES)}.",
        f"Explain {topic} to a beginner.",
        f"Give me three tips for {topic}.",
    ])
    opener = rng.choice(["Sure!", "Of course.", "Great question.", "Happy to help.", "Here are some thoughts.",
                         "Good idea.", "Absolutely."])
    parts = [opener]
    n_par = rng.randint(1, 3)
    for _ in range(n_par):
        parts.append(" ".join(_sentence(rng) for _ in range(rng.randint(2, 4))))
    if rng.random() < 0.5:
        parts.append(rng.choice(["I hope this helps!", "Good luck!", "Let me know if you want more ideas.",
                                 "Enjoy the process."]))
    return u, "\n\n".join(parts)


# --------------------------------------------------------------------------------------------------
# verse


V_ECHO = ("sorrow glory silence longing mercy fever wonder hunger patience ruin rapture solace thunder "
          "embers vigil murmur promise absence harvest reverie lament triumph refuge delight yearning "
          "shelter reckoning devotion fortune folly grief splendor tempest quiet courage memory midnight "
          "dawning twilight whisper riddle anthem echo omen season journey ransom").split()
# Each verse noun owns one "echo" word (a fixed, seeded pairing). Lines place the echo two or more tokens
# after its noun, so a parallel drafter whose Markov head only sees the previous token can not infer it
# from a sampled noun: verse acceptance stays low at any temperature.
_ECHO_RNG = random.Random(4242)
V_ECHO_OF = {n: V_ECHO[_ECHO_RNG.randrange(len(V_ECHO))] for n in V_NOUN}


def _verse_line(rng: random.Random) -> str:
    t = rng.randrange(5)
    A, N, V, P = V_ADJ, V_NOUN, V_VERB, V_PREP
    c = rng.choice
    n1, n2 = c(N), c(N)
    e1, e2 = V_ECHO_OF[n1], V_ECHO_OF[n2]
    if t == 0:
        s = f"the {n1} of {e1} {c(V)} {c(P)} the {n2} of {e2}"
    elif t == 1:
        s = f"{n1} of {e1}, {n2} of {e2}"
    elif t == 2:
        s = f"{c(A)} {n1} of {e1} and {c(A)} {n2} of {e2}"
    elif t == 3:
        s = f"o {n1} of {e1}, o {n2} of {e2}"
    else:
        s = f"and every {n1} of {e1} {c(V)} like {n2} of {e2}"
    return s[0].upper() + s[1:] + rng.choice([",", "", ".", ";", ""])


def verse_exchange(rng: random.Random) -> tuple[str, str]:
    """A request for a poem and a poem whose words are drawn uniformly from large lists."""
    form, topic = rng.choice(V_FORMS), rng.choice(V_TOPICS)
    u = rng.choice([f"Write a {form} about {topic}.", f"Can you write a {form} about {topic}?",
                    f"Compose a {form} about {topic}.", f"I need a {form} about {topic}, please."])
    n_lines = 3 if form == "haiku" else (5 if form == "limerick" else 4)
    stanzas = 1 if form in ("haiku", "limerick") else rng.randint(2, 3)
    title = f"{rng.choice(V_ADJ).title()} {rng.choice(V_NOUN).title()}"
    body = "\n\n".join("\n".join(_verse_line(rng) for _ in range(n_lines)) for _ in range(stanzas))
    return u, f"**{title}**\n\n{body}"


# --------------------------------------------------------------------------------------------------
# code (the standard library)

_SKIP_DIRS = {"site-packages", "dist-packages", "idlelib", "lib2to3", "__pycache__", "ensurepip", "turtledemo",
              "encodings", "pydoc_data", "tkinter", "test", "tests"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _heldout(rel: str) -> bool:
    return zlib.crc32(rel.encode()) % 100 < HELDOUT_PERCENT


def stdlib_files(split: str = "train", max_bytes: int = 300_000) -> list[Path]:
    """Stdlib ``.py`` files (tests, vendored and site packages excluded), deterministic train/eval split."""
    root = stdlib_root()
    out: list[Path] = []
    for dp, dns, fns in os.walk(root):
        dns[:] = sorted(d for d in dns if d not in _SKIP_DIRS and not d.startswith(("test", "config-")))
        for f in sorted(fns):
            if not f.endswith(".py"):
                continue
            fp = Path(dp) / f
            try:
                if fp.stat().st_size > max_bytes:
                    continue
            except OSError:
                continue
            rel = fp.relative_to(root).as_posix()
            if _heldout(rel) == (split == "eval"):
                out.append(fp)
    return out


def _read(fp: Path) -> str | None:
    try:
        return fp.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _functions(src: str) -> Iterator[tuple[str, str, str]]:
    """(summary, signature+docstring stub, full source) of documented top-level/method functions."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return
    lines = src.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or node.name.startswith("_") or node.end_lineno is None:
            continue
        seg_lines = lines[node.lineno - 1 : node.end_lineno]
        seg = textwrap.dedent("\n".join(seg_lines))
        if len(seg) > 2500:
            continue
        summary = doc.strip().splitlines()[0].strip().rstrip(".")
        if len(summary) < 12:
            continue
        body0 = node.body[0]
        stub_lines = seg.splitlines()[: max(1, (body0.end_lineno or node.lineno) - node.lineno + 1)]
        yield summary, "\n".join(stub_lines), seg


_FN_WORDS = ("values items numbers data records scores entries prices counts weights sizes ages totals "
              "readings samples").split()
_VAR_X = ("x", "item", "value", "n", "v", "num", "elem")
_ACC = ("result", "total", "acc", "out", "best", "count")


def code_task(rng: random.Random) -> tuple[str, str]:
    """A small, templated Python task and its canonical solution (predictable given the request)."""
    arg, x, acc = rng.choice(_FN_WORDS), rng.choice(_VAR_X), rng.choice(_ACC)
    k = rng.randrange(6)
    if k == 0:
        what, init, upd = rng.choice([("sum", "0", f"{acc} += {x}"), ("product", "1", f"{acc} *= {x}"),
                                       ("sum of squares", "0", f"{acc} += {x} * {x}")])
        name = f"{what.replace(' ', '_')}_of_{arg}"
        desc = f"return the {what} of the {arg}"
        body = f"    {acc} = {init}\n    for {x} in {arg}:\n        {upd}\n    return {acc}"
    elif k == 1:
        cond, expr = rng.choice([("positive", f"{x} > 0"), ("even", f"{x} % 2 == 0"), ("odd", f"{x} % 2 == 1"),
                                 ("negative", f"{x} < 0"), ("non-zero", f"{x} != 0")])
        name = f"{cond.replace('-', '_')}_{arg}"
        desc = f"keep only the {cond} {arg}"
        body = f"    return [{x} for {x} in {arg} if {expr}]"
    elif k == 2:
        op, cmp_ = rng.choice([("largest", ">"), ("smallest", "<")])
        name = f"{op}_of_{arg}"
        desc = f"find the {op} of the {arg}"
        body = (f"    if not {arg}:\n        return None\n    {acc} = {arg}[0]\n    for {x} in {arg}[1:]:\n"
                f"        if {x} {cmp_} {acc}:\n            {acc} = {x}\n    return {acc}")
    elif k == 3:
        name = f"count_{arg}"
        desc = f"count how often each of the {arg} occurs"
        body = (f"    {acc} = {{}}\n    for {x} in {arg}:\n        {acc}[{x}] = {acc}.get({x}, 0) + 1\n"
                f"    return {acc}")
    elif k == 4:
        what, expr = rng.choice([("reverse", "text[::-1]"), ("upper-case", "text.upper()"),
                                 ("strip", "text.strip()"), ("lower-case", "text.lower()")])
        name = f"{what.replace('-', '_')}_text"
        desc = f"{what} a string"
        arg = "text"
        body = f"    return {expr}"
    else:
        scale = rng.randint(2, 9)
        name = f"scale_{arg}"
        desc = f"multiply each of the {arg} by {scale}"
        body = f"    return [{x} * {scale} for {x} in {arg}]"
    doc = desc[0].upper() + desc[1:] + "."
    code = f'def {name}({arg}):\n    """{doc}"""\n{body}\n'
    if rng.random() < 0.5:
        prompt = f"Write a python function to {desc}."
    else:
        prompt = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                  f'```python\ndef {name}({arg}):\n    """{doc}"""\n```')
    return prompt, f"```python\n{code}```"


def _code_docs(rng: random.Random, files: list[Path], budget: int) -> list[Doc]:
    docs: list[Doc] = []
    used = 0
    order = list(files)
    rounds = 0
    while used < budget and order and rounds < 50:
        rng.shuffle(order)
        for fp in order:
            src = _read(fp)
            if not src:
                continue
            # raw source in chunks of ~4 kB, cut at line boundaries
            lines, cur, chunks = src.splitlines(keepends=True), [], []
            size = 0
            for ln in lines:
                cur.append(ln)
                size += len(ln)
                if size > 4000:
                    chunks.append("".join(cur))
                    cur, size = [], 0
            if cur:
                chunks.append("".join(cur))
            for ch in chunks:
                docs.append(Doc("code", ch + PAD_TOKEN))
                used += len(ch)
            for summary, stub, full in _functions(src):
                if rng.random() < 0.5:
                    u = f"Write a python function to {summary[0].lower() + summary[1:]}."
                else:
                    u = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                         f"```python\n{stub}\n```")
                text = format_chat([{"role": USER_ROLE, "content": u},
                                    {"role": ASSISTANT_ROLE, "content": f"```python\n{full}\n```"}])
                docs.append(Doc("code", text + PAD_TOKEN))
                used += len(text)
            if used >= budget:
                break
        rounds += 1
    return docs


# --------------------------------------------------------------------------------------------------
# assembly


def _chat_doc(workload: str, rng: random.Random) -> Doc:
    gen = {"math": math_problem, "chat": chat_exchange, "verse": verse_exchange}[workload]
    u, a = gen(rng)
    return Doc(workload, format_chat([{"role": USER_ROLE, "content": u}, {"role": ASSISTANT_ROLE, "content": a}])
               + PAD_TOKEN)


def build_corpus(
    seed: int = 0, total_chars: int = 4_000_000, mix: dict[str, float] | None = None, code_split: str = "train"
) -> list[Doc]:
    """A shuffled list of documents, about ``total_chars`` long, split by ``mix`` (fractions by characters).

    Code comes from the ``code_split`` split of the stdlib (cycled if the budget exceeds it); the other
    workloads are generated. Each document ends with the ``<|endoftext|>`` separator.
    """
    mix = dict(DEFAULT_MIX if mix is None else mix)
    bad = set(mix) - set(WORKLOADS)
    if bad:
        raise ValueError(f"unknown workloads in mix: {sorted(bad)} (known: {WORKLOADS})")
    s = sum(mix.values())
    rng = random.Random(seed)
    docs: list[Doc] = []
    for w in WORKLOADS:
        budget = int(total_chars * mix.get(w, 0.0) / s)
        if budget <= 0:
            continue
        if w == "code":
            # half the standard library itself, half small templated tasks
            docs.extend(_code_docs(random.Random(seed * 7919 + 1), stdlib_files(code_split), int(budget * 0.5)))
            used, crng = 0, random.Random(seed * 7919 + 2)
            while used < budget * 0.5:
                u, a = code_task(crng)
                d = Doc("code", format_chat([{"role": USER_ROLE, "content": u},
                                             {"role": ASSISTANT_ROLE, "content": a}]) + PAD_TOKEN)
                docs.append(d)
                used += len(d.text)
            continue
        used = 0
        while used < budget:
            d = _chat_doc(w, rng)
            docs.append(d)
            used += len(d.text)
    rng.shuffle(docs)
    return docs


def eval_prompts(workload: str, n: int, seed: int = 12345) -> list[str]:
    """``n`` first-turn user prompts for a workload, disjoint from training where it matters.

    math/chat/verse are generated with an evaluation seed; code uses the held-out stdlib files.
    """
    rng = random.Random(seed + EVAL_WORKLOADS.index(workload) if workload in EVAL_WORKLOADS else seed)
    if workload in ("math", "chat", "verse"):
        gen = {"math": math_problem, "chat": chat_exchange, "verse": verse_exchange}[workload]
        return [gen(rng)[0] for _ in range(n)]
    if workload == "code":
        # short function tasks in the style of MBPP/HumanEval, generated with the evaluation seed
        return [code_task(rng)[0] for _ in range(n)]
    if workload == "code-stdlib":
        # documented functions of the held-out stdlib files: real library code, much harder for a tiny target
        return _stdlib_prompts(rng, n)
    raise ValueError(f"unknown workload {workload!r} (known: {EVAL_WORKLOADS})")


def _stdlib_prompts(rng: random.Random, n: int) -> list[str]:
    """Requests built from documented functions of the held-out stdlib files."""
    if n <= 0:
        return []
    out: list[str] = []
    files = stdlib_files("eval")
    rng.shuffle(files)
    for fp in files:
        for summary, stub, _full in _functions(_read(fp) or ""):
            if rng.random() < 0.5:
                out.append(f"Write a python function to {summary[0].lower() + summary[1:]}.")
            else:
                out.append("Write a solution to the following problem and make sure that it passes the "
                           f"tests:\n```python\n{stub}\n```")
            if len(out) >= n:
                return out
    if not out:
        raise RuntimeError("no documented functions found in the held-out stdlib files")
    return [out[i % len(out)] for i in range(n)]
