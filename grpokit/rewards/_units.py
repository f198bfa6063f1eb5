"""Words after a number in a math answer, for `math_accuracy` (see `accuracy.py`): which ones leave the
value as it is ("18 apples" to a question about apples, "18 years" to "How old is Tom?", "$18 per day" to
"How much does he earn each day?") and which state another value ("18 dozen", "18 cents" for dollars).

Units are compared by what they are, whatever their spelling (`canonical`: "min", "minutes" and "minute"
are one unit; "cm" and "centimetres" another), and by what they measure (`UNIT_DIMENSIONS`). A number may
be followed by
  - the unit the question asks for (`asked_unit`: "How many minutes ...", "... in hours?", "Express your
    answer in metres"): then no other unit, even one the question mentions elsewhere ("A trip takes 2 hours.
    How many minutes is that?" is not answered by "120 hours");
  - else a unit the question uses, or any unit of a quantity the question gives in no unit;
  - a rate: "per X", "a X", "every X" or "/X" where X is such a unit ("$18 per day", "$18/day");
  - words of the question and the neutral words of `NEUTRAL` ("in total", "each").
A unit of a quantity the question measures in another unit states another value ("18 cents" for dollars,
"18 km" for metres, "18 kg" for pounds), and so does any other word.
"""

from __future__ import annotations

import re

from grpokit.scoring.completions import to_text

NOT_UNITS = frozenset(
    "or and nor not to plus minus times over divided mod hundred hundreds thousand thousands million "
    "millions billion billions trillion dozen dozens squared cubed half halves thirds quarters pi sqrt "
    "doubled tripled quadrupled halved tenths hundredths thousandths millionths score scores "
    "factorial percent more less fewer than about approximately roughly nearly almost around least "
    "most at is are was were if".split()
)
"""Words that change the value of the number before them (or make it not a number)."""
NEUTRAL = frozenset("in total altogether all together overall each per".split())
"""Trailing words that never change a value, whatever the question ("per" only before a unit, see above)."""
UNIT_DIMENSIONS = {
    **dict.fromkeys("second minute hour day week month year decade century".split(), ("time",)),
    **dict.fromkeys("millimeter centimeter meter kilometer inch foot yard mile".split(), ("length",)),
    **dict.fromkeys("milligram gram kilogram ounce ton".split(), ("mass",)),
    **dict.fromkeys("milliliter liter gallon quart pint cup teaspoon tablespoon".split(), ("volume",)),
    **dict.fromkeys("degree radian".split(), ("angle",)),
    **dict.fromkeys("dollar cent penny nickel dime euro yen rupee".split(), ("money",)),
    "pound": ("money", "mass"),
}
"""Units (canonical, singular) by what they measure; a pound is money or mass."""
_ALIASES = {
    **dict.fromkeys("s sec secs".split(), "second"),
    **dict.fromkeys("min mins".split(), "minute"),
    **dict.fromkeys("h hr hrs".split(), "hour"),
    **dict.fromkeys("yr yrs".split(), "year"),
    **{"mm": "millimeter", "millimetre": "millimeter", "cm": "centimeter", "centimetre": "centimeter"},
    **{"m": "meter", "metre": "meter", "km": "kilometer", "kilometre": "kilometer"},
    **{"ft": "foot", "yd": "yard", "mi": "mile", "mg": "milligram", "g": "gram", "kg": "kilogram"},
    **{"lb": "pound", "lbs": "pound", "oz": "ounce", "tonne": "ton", "ml": "milliliter"},
    **{"millilitre": "milliliter", "l": "liter", "litre": "liter", "tsp": "teaspoon", "tbsp": "tablespoon"},
    **{"deg": "degree", "rad": "radian", "usd": "dollar", "buck": "dollar", "euros": "euro"},
}
_IRREGULAR = {"feet": "foot", "inches": "inch", "pennies": "penny", "centuries": "century"}
_CURRENCY_SIGNS = {"$": "dollar", "€": "euro", "£": "pound", "¥": "yen", "₹": "rupee"}
_WORD_RE = re.compile(r"[a-z]+")


def singular(word: str) -> str:
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if word.endswith(("ches", "shes", "xes")):
        return word[:-2]
    return word[:-1] if word.endswith("s") and not word.endswith("ss") and len(word) > 2 else word


def canonical(word: str) -> str | None:
    """The unit a word names ("mins" -> "minute", "Metres" -> "meter"), None when it names none."""
    word = word.lower()
    for form in (word, singular(word)):
        unit = _ALIASES.get(form, form)
        if unit in UNIT_DIMENSIONS:
            return unit
    return None


class QuestionUnits(frozenset):
    """The words of a question (see `question_units`), the unit it asks for (`asked`) and the unit of the
    rate it asks for (`rate`: "day" in "How much does he earn each day?"), each None when there is none."""

    asked: str | None = None
    rate: str | None = None


_ASKED_RE = re.compile(
    r"\bhow\s+many\s+(?:more\s+|fewer\s+|less\s+|extra\s+|additional\s+|total\s+|square\s+|cubic\s+)*([a-z]+)"
    r"|\b(?:in|into|to)\s+(?:the\s+nearest\s+|whole\s+|units\s+of\s+)?([a-z]+)\s*(?:[?.]|$)"
    r"|\b(?:answer|result|it)\s+in\s+([a-z]+)",
    re.IGNORECASE,
)


def asked_unit(text: str) -> str | None:
    """The unit the question asks its answer in: the last "how many X", "... in X?" or "answer in X" that
    names a unit (canonical), None when it asks in none."""
    unit = None
    for m in _ASKED_RE.finditer(text):
        named = canonical(next(g for g in m.groups() if g))
        unit = named or unit
    return unit


def question_units(prompt: object) -> QuestionUnits | None:
    """The words a number may be followed by in an answer to `prompt`: its own words (and their singular
    forms), the currency its currency sign names, "%" when it speaks of percent; minus the words that
    change a value; and the unit it asks for. None without a prompt."""
    text = to_text(prompt).lower()
    if not text:
        return None
    found = _WORD_RE.findall(text)
    words = (set(found) | {singular(w) for w in found}) - NOT_UNITS
    words |= {unit for sign, unit in _CURRENCY_SIGNS.items() if sign in text}
    if "%" in text or re.search(r"\bper\s?cent|\bpercent", text):
        words.add("%")
    out = QuestionUnits(words)
    out.asked = asked_unit(text)
    asks = re.findall(r"[^.!?]*\?", text)
    rates = [canonical(w) for w in _RATE_ASKED_RE.findall(asks[-1] if asks else text)]
    out.rate = next((r for r in reversed(rates) if r is not None), None)
    return out


_RATE_ASKED_RE = re.compile(r"\b(?:per|each|every|a|an)\s+([a-z]+)")


def words_allowed(words: list[str], units: frozenset[str] | None) -> bool:
    """False when the words after a number may change its value (see the module doc): with a question,
    a word it does not use or a unit other than the one it asks for; without one, the words of NOT_UNITS."""
    if units is None:
        return not any(w in NOT_UNITS for w in words)
    asked, rate = getattr(units, "asked", None), getattr(units, "rate", None)
    mentioned = {canonical(u) for u in units} - {None}
    measured = {d for u in mentioned for d in UNIT_DIMENSIONS[u]}
    for k, w in enumerate(words):
        one, unit = singular(w), canonical(w)
        if w == "per" and k + 1 < len(words) and canonical(words[k + 1]) is not None:
            continue  # a rate: the unit after it is checked on its own
        if unit is not None:
            wanted = rate if k > 0 and words[k - 1] == "per" else asked
            if wanted is not None:
                if unit != wanted:
                    return False  # "120 hours" to "How many minutes ...?", "$18 per hour" to "... each day?"
                continue
            if unit in mentioned or not set(UNIT_DIMENSIONS[unit]) & measured:
                continue  # the question's unit, or a unit of what the question measures in no unit
            return False  # a unit other than the question's for the same quantity (cents for $)
        if w in units or one in units or w + "s" in units or w in NEUTRAL or one in NEUTRAL:
            continue
        return False
    return True


_GLUED_RE = re.compile(r"(?<=\d)([A-Za-z]{1,12})$")
_RATE_RE = re.compile(r"(?:\s*/\s*|\s+(?:a|an|every)\s+)([A-Za-z]+)$")


def spaced_units(s: str) -> str:
    """A unit glued to its number or written as a rate, spelled with spaces: "18cm" -> "18 cm",
    "$18/day" and "$18 a day" -> "$18 per day". Letters that are not a unit stay ("2x")."""
    m = _GLUED_RE.search(s)
    if m and canonical(m.group(1)) is not None:
        s = f"{s[: m.start()]} {m.group(1)}"
    m = _RATE_RE.search(s)
    if m and canonical(m.group(1)) is not None:
        s = f"{s[: m.start()]} per {m.group(1)}"
    return s


_AFTER_RE = re.compile(
    r"^[\s$]*(?:\\[,;: !]\s*)*(?:(\\?%)|(?:\\(?:text|mathrm|textrm|mbox|operatorname)\s*\{\s*)?([A-Za-z]+)\b)"
)


def unit_after(text: str) -> str | None:
    """The unit or percent sign written right after a boxed value ("\\boxed{120} hours",
    "\\boxed{18}\\text{ cm}", "\\boxed{50}\\%"): part of the value, so that a unit the question does not ask
    for is seen. None when what follows is not a unit."""
    m = _AFTER_RE.match(text[:60])
    if m is None:
        return None
    if m.group(1):
        return "%"
    return m.group(2) if canonical(m.group(2)) is not None else None
