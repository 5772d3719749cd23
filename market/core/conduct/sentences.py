"""Free text as normalised sentences for the rule extractor (:mod:`market.core.conduct.text`).

A text is lower-cased and normalised (:func:`market.core.claims.normalise`); number words become
digits ("forty-five", "a hundred and twenty"); common abbreviations, contractions and misspellings
get one spelling ("rd 4" -> "round 4", "12 cr" -> "12 credits"); rounds given relative to now
("next round", "in 2 rounds") become round numbers; it is cut into sentences (a decimal point
does not end one; questions are dropped unless asked for); and a pronoun that stands for the
speaker's job or budget of the sentence before is read as that noun (:func:`resolve_pronouns`).
"""

from __future__ import annotations

import re

from market.core.claims import normalise, number_words_as_digits

_ASKING = re.compile(
    r"^(?:do|does|did|is|are|was|were|can|could|will|would|should|shall|may|might|must|have|has"
    r"|how|what|why|when|who|whom|which|where)\b"
)
_SENTENCE = re.compile(r"(?:[^.!?;\n]|(?<=\d)\.(?=\d))+[.!?;]?")  # "2.5" is one number


_UNITS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_NUMBER_WORD = r"(?:" + "|".join(_UNITS + _TENS + ["hundred", "thousand"]) + r")"
_NUMBER_RUN = re.compile(
    rf"\b(?:a (?=hundred|thousand))?{_NUMBER_WORD}(?:(?:[- ]| and ){_NUMBER_WORD})*\b"
)
# canonical spellings (see the note above the patterns)
_SPELLING = [
    (re.compile(r"\brd\.? (?=\d)"), "round "),
    (re.compile(r"(?<=\d) ?cr\b\.?"), " credits"),
    (re.compile(r"\btil+\b"), "until"),
    (re.compile(r"\b(won|don|can)t\b"), r"\1't"),
    (re.compile(r"\b(?:buget|budjet|bugdet|budegt)\b"), "budget"),
    (re.compile(r"\b(?:ned|nead|neeed)\b"), "need"),
    (re.compile(r"\b(?:reqire|requre|requier)\b"), "require"),
    (re.compile(r"\b(?:blcoks|bloks|blokcs|bocks)\b"), "blocks"),
    (re.compile(r"\b(?:dealine|deadine|deadlne)\b"), "deadline"),
    (re.compile(r"\b(?:delivr|delvier|deliever)\b"), "deliver"),
    # units and informal spellings: "3x blocks", "we've a job", "gotta", "atm", "u", and a
    # possessive that names the speaker's own lab ("our team's budget" is "our budget")
    (
        re.compile(
            r"(?<=\d) ?x (?=(?:more |extra |additional |further )?(?:gpu[- ]?)?(?:blocks?|gpus?)\b)"
        ),
        " ",
    ),
    (re.compile(r"\b(we|i|you|they)'ve\b"), r"\1 have"),
    (re.compile(r"\bgotta\b"), "have to"),
    (re.compile(r"\bgonna\b"), "going to"),
    (re.compile(r"\bwanna\b"), "want to"),
    (re.compile(r"\batm\b"), "at the moment"),
    (re.compile(r"\bu\b"), "you"),
    (re.compile(r"\bur\b"), "your"),
    (
        re.compile(r"\b(our|my) (?:lab|team|organi[sz]ation|company|group|side|firm|outfit)'s\b"),
        r"\1",
    ),
]
# a round given relative to now, made absolute (only where the current round is known):
# "next round", "the round after next", "in 2 rounds", "within 2 rounds", "for 2 more rounds"
# (until then), "2 rounds away" / "from now"
_RELATIVE: list[tuple[re.Pattern[str], str, int | None]] = [
    (
        re.compile(r"\b(by|before|until|through|in|at|for|on|during) (?:the )?next round\b"),
        r"\1 round {}",
        1,
    ),
    (re.compile(r"\b(?:in |by )?the round after next\b"), "in round {}", 2),
    (re.compile(r"\bnext round\b"), "in round {}", 1),
    (re.compile(r"\bwithin (\d{1,2}) (?:more )?rounds?\b"), "by round {}", None),
    (re.compile(r"\bin (\d{1,2}) (?:more )?rounds?(?: from now| time)?\b"), "in round {}", None),
    (
        re.compile(r"\bfor (?:another |the next )?(\d{1,2}) (?:more |further )?rounds?\b"),
        "until round {}",
        None,
    ),
    (re.compile(r"\b(\d{1,2}) (?:more )?rounds? (?:away|from now)\b"), "round {}", None),
]


def _number_value(run: str) -> int:
    """The value of a run of number words ("a hundred and twenty" -> 120)."""
    total = current = 0
    for word in re.split(r"[- ]+", run):
        if word in ("a", "and"):
            continue
        if word in _UNITS:
            current += _UNITS.index(word)
        elif word in _TENS:
            current += 20 + 10 * _TENS.index(word)
        elif word == "hundred":
            current = max(current, 1) * 100
        else:  # thousand
            total, current = total + max(current, 1) * 1000, 0
    return total + current


def _canonical(norm: str) -> str:
    """``norm`` (normalised) with number words as digits and canonical spellings."""
    norm = _NUMBER_RUN.sub(lambda m: str(_number_value(m.group(0))), norm)
    norm = number_words_as_digits(norm)
    for pattern, repl in _SPELLING:
        norm = pattern.sub(repl, norm)
    return norm


def _absolute_rounds(norm: str, now: int) -> str:
    """``norm`` with rounds given relative to round ``now`` made absolute ("in 2 rounds" ->
    "in round 4" in round 2)."""
    for pattern, repl, offset in _RELATIVE:

        def sub(m: re.Match[str], repl: str = repl, offset: int | None = offset) -> str:
            if offset is None:  # the offset is the number matched
                return repl.format(now + int(m.group(1)))
            return m.expand(repl.format(now + offset))

        norm = pattern.sub(sub, norm)
    return norm


def split_sentences(text: str, questions: bool = False, now: int | None = None) -> list[str]:
    """Normalised sentences of ``text`` with number words as digits and, where the current
    round ``now`` is given, relative rounds made absolute; questions dropped unless
    ``questions``."""
    norm = _canonical(normalise(text))
    norm = re.sub(r"(\d),(\d{3})\b", r"\1\2", norm)
    if now is not None:
        norm = _absolute_rounds(norm, now)
    out = []
    for s in (s.strip() for s in _SENTENCE.findall(norm)):
        if s and not questions and s.endswith("?"):
            # "we need 2 blocks, can you sell?": the statement before the question stays
            s = s.rsplit(",", 1)[0] if "," in s and not _ASKING.search(s) else ""
        if s:
            out.append(s)
    return out


# A sentence about the speaker's own job or budget, then a pronoun for it in the next sentence
# ("We have one urgent job. Its deadline is round 5."): the pronoun is read as the noun.
_ANTECEDENT = re.compile(
    r"^(?:[a-z' ]{1,20}: )?(?:[a-z,']+ ){0,3}?(?:(?:we|i) (?:[a-z]+ )?(?:have|got|own|run|hold)\b"
    r"|(?:our|my)\b)"
    r".*?\b(budget|jobs?|training runs?|projects?|workload)\b"
)
_PRONOUNS: list[tuple[re.Pattern[str], str, bool]] = [
    # (pattern at the sentence start, replacement with {} for the noun, for jobs only)
    (
        re.compile(
            r"^(together,? |combined,? |all together,? )?(?:they|these|those)(?:'re| are)\b"
        ),
        r"\1our jobs are",
        True,
    ),
    (re.compile(r"^(?:they|these|those) (?=need|require|pay|earn|are)"), "our jobs ", True),
    (re.compile(r"^the (biggest|largest|heaviest|main) (?:one|1)\b"), r"our \1 job", True),
    (re.compile(r"^(?:and |but )?(?:it|this one)(?:'s| is)\b"), "our {} is", False),
    (
        re.compile(r"^(?:and |but )?it (?=needs|requires|takes|spans|expires|ends|has|pays|is)"),
        "our {} ",
        False,
    ),
    (re.compile(r"^(?:and |but )?its\b"), "our {}'s", False),
]


def resolve_pronouns(sentences: list[str]) -> list[str]:
    """``sentences`` with a leading pronoun replaced by the speaker's own noun of the sentence
    before (see ``_ANTECEDENT``)."""
    out = list(sentences)
    for i in range(1, len(out)):
        m = _ANTECEDENT.search(sentences[i - 1])
        if not m:
            continue
        noun = m.group(1)
        jobs = noun != "budget"
        singular = "job" if noun.startswith("job") else noun.rstrip("s") if jobs else noun
        for pattern, repl, jobs_only in _PRONOUNS:
            if jobs_only and not jobs:
                continue
            new = pattern.sub(repl.replace("{}", singular), out[i], count=1)
            if new != out[i]:
                out[i] = new
                break
    return out
