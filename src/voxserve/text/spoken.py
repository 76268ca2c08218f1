"""English text to its spoken form: numbers, money, dates, times, units, abbreviations, ...

`normalize_text("$1,234.56")` -> "one thousand two hundred thirty-four dollars and fifty-six cents".

espeak-ng reads much of this badly ("1990s" as "nineteen hundred ninety z", "St." always as
"saint"), so the Piper front end runs this pass after the typographic `normalize_unicode` and
before sentence splitting. Only English has rules: any other language is returned unchanged.

The rules are tables: `_RULES` is an ordered list of (regex, handler); each regex is applied
over the whole text and its matches replaced by the handler's words. Earlier rules take what
they match (a phone number is never read as a range; an e-mail address never as an
abbreviation). Handlers emit only letters, spaces and punctuation, so a later numeric rule
cannot match inside an earlier rule's output. Units, currencies, months, abbreviations and
regnal names are tables too.

Every regex is linear in the input: repetitions are bounded ({1,15}) or possessive, and
multi-part patterns start with a lookbehind so that a failed match is not retried from every
position inside one long run of digits and dots.

Number words come from num2words (its English is British: "one hundred and one"; the "and"
and the commas are dropped for the American reading the voices expect).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from .aligned import Aligned, Pieces, Said

# ---------------------------------------------------------------------------------------------
# number words


def cardinal(n: int) -> str:
    """1234 -> "one thousand two hundred thirty-four"; negative -> "minus ..."."""
    if n < 0:
        return "minus " + cardinal(-n)
    from num2words import num2words  # imports every language: a text without numbers skips it

    return _american(num2words(n, lang="en"))


def ordinal(n: int) -> str:
    """22 -> "twenty-second"."""
    from num2words import num2words

    return _american(num2words(n, lang="en", to="ordinal"))


def _american(words: str) -> str:
    return words.replace(",", "").replace(" and ", " ")


_DIGIT = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def digits(s: str) -> str:
    """"4567" -> "four five six seven" (other characters are dropped)."""
    return " ".join(_DIGIT[int(c)] for c in s if c.isdigit())


def year(n: int) -> str:
    """1990 -> "nineteen ninety", 1905 -> "nineteen oh five", 1900 -> "nineteen hundred",
    2005 -> "two thousand five", 2026 -> "twenty twenty-six"."""
    if not 1000 <= n <= 9999 or 2000 <= n <= 2009 or n % 1000 == 0:
        return cardinal(n)
    hi, lo = divmod(n, 100)
    if lo == 0:
        return cardinal(hi) + " hundred"
    return cardinal(hi) + " " + (("oh " + cardinal(lo)) if lo < 10 else cardinal(lo))


def _plural_word(words: str) -> str:
    """The plural of a number's last word: "nineteen ninety" -> "nineteen nineties"."""
    head, _, last = words.rpartition(" ")
    if "-" in last:
        pre, _, last = last.rpartition("-")
        head = (head + " " if head else "") + pre + "-"
        sep = ""
    else:
        sep = " " if head else ""
    last = last[:-1] + "ies" if last.endswith("y") else last + ("es" if last.endswith("x") else "s")
    return head + sep + last


def decimal(int_part: str, frac: str | None, negative: bool = False) -> str:
    """("1,234", "56") -> "one thousand two hundred thirty-four point five six"."""
    # "007": leading zeros are read digit by digit; so is a number past the trillions
    whole = int_part.replace(",", "")
    out = digits(int_part) if (len(int_part) > 1 and int_part[0] == "0") or len(whole) > 15 else cardinal(int(whole))
    if frac:
        out += " point " + digits(frac)
    return ("minus " + out) if negative else out


def _is_one(int_part: str, frac: str | None) -> bool:
    return int_part == "1" and not frac


# ---------------------------------------------------------------------------------------------
# tables

# symbol: (singular, plural, sub-unit singular, sub-unit plural); None: no sub-unit
CURRENCIES: dict[str, tuple[str, str, str | None, str | None]] = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", None, None),
}
SCALES = {"thousand": "thousand", "million": "million", "billion": "billion", "trillion": "trillion",
          "k": "thousand", "K": "thousand", "m": "million", "M": "million", "bn": "billion", "B": "billion"}

# unit as written after a number: (singular, plural)
UNITS: dict[str, tuple[str, str]] = {
    "km": ("kilometer", "kilometers"), "m": ("meter", "meters"), "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"), "nm": ("nanometer", "nanometers"), "mi": ("mile", "miles"),
    "ft": ("foot", "feet"), "yd": ("yard", "yards"),
    "kg": ("kilogram", "kilograms"), "g": ("gram", "grams"), "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"), "lbs": ("pound", "pounds"), "oz": ("ounce", "ounces"),
    "l": ("liter", "liters"), "L": ("liter", "liters"), "ml": ("milliliter", "milliliters"),
    "mL": ("milliliter", "milliliters"),
    "mph": ("mile per hour", "miles per hour"), "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"), "m/s": ("meter per second", "meters per second"),
    "°C": ("degree Celsius", "degrees Celsius"), "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
    "ms": ("millisecond", "milliseconds"), "s": ("second", "seconds"), "sec": ("second", "seconds"),
    "min": ("minute", "minutes"), "h": ("hour", "hours"), "hr": ("hour", "hours"), "hrs": ("hour", "hours"),
    "KB": ("kilobyte", "kilobytes"), "kB": ("kilobyte", "kilobytes"),
    "MB": ("megabyte", "megabytes"), "GB": ("gigabyte", "gigabytes"), "TB": ("terabyte", "terabytes"),
    "Hz": ("hertz", "hertz"), "kHz": ("kilohertz", "kilohertz"), "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"),
    "W": ("watt", "watts"), "kW": ("kilowatt", "kilowatts"), "kWh": ("kilowatt hour", "kilowatt hours"),
    "V": ("volt", "volts"), "mA": ("milliamp", "milliamps"),
    "%": ("percent", "percent"),
}
# longest first, so that "km/h" is tried before "km" and "ms" before "m"
_UNIT_ALT = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
MONTH_NAMES: dict[str, int] = {m: i for i, m in enumerate(MONTHS, 1)}
MONTH_NAMES.update({m[:3]: i for i, m in enumerate(MONTHS, 1)})
MONTH_NAMES["Sept"] = 9
_MONTH_ALT = "|".join(sorted(MONTH_NAMES, key=len, reverse=True))

SLASH_IDIOMS = {"24/7": "twenty-four seven", "9/11": "nine eleven", "50/50": "fifty-fifty", "365/24/7": "three sixty-five twenty-four seven"}
FRACTIONS = {2: ("half", "halves"), 4: ("quarter", "quarters")}
VULGAR = {"½": (1, 2), "⅓": (1, 3), "⅔": (2, 3), "¼": (1, 4), "¾": (3, 4), "⅛": (1, 8), "⅜": (3, 8),
          "⅝": (5, 8), "⅞": (7, 8), "⅕": (1, 5)}

# words after which a four-digit number is a year ("in 1990", "since 2005")
YEAR_CONTEXT = ("in", "In", "since", "Since", "by", "By", "from", "From", "until", "Until", "till",
                "to", "before", "Before", "after", "After", "during", "During", "of", "year", "Year",
                "circa", "around", "early", "late", "mid", "summer", "winter", "spring", "autumn", "fall",
                "through", "between", "Between")

# a Roman numeral after these is a number ("Chapter IV" -> "Chapter four")
ROMAN_KEYWORDS = ("Chapter", "Part", "Book", "Volume", "Vol.", "Act", "Scene", "Section", "Article",
                  "Appendix", "Phase", "Season", "Episode", "Level", "Stage", "Round", "World War", "Super Bowl",
                  "Title", "Class", "Type", "Grade", "Psalm", "Canto")
# ... and after these names an ordinal ("Henry VIII" -> "Henry the eighth")
REGNAL_NAMES = ("Henry", "Louis", "Edward", "George", "Elizabeth", "Charles", "James", "William", "Richard",
                "John", "Paul", "John Paul", "Benedict", "Pius", "Leo", "Gregory", "Innocent", "Clement",
                "Urban", "Boniface", "Alexander", "Philip", "Frederick", "Napoleon", "Peter", "Catherine",
                "Nicholas", "Ivan", "Mary", "Victoria", "Ferdinand", "Isabella", "Alfonso", "Juan Carlos",
                "Carl", "Gustav", "Olav", "Harald", "Christian", "Wilhelm", "Otto", "Ramesses", "Ramses",
                "Constantine", "Justinian", "Selim", "Mehmed", "Suleiman", "Francis", "Robert",
                "David", "Malcolm", "Stephen", "Anne", "Sancho", "Pedro", "Manuel", "Rama", "Haakon",
                "Eric", "Magnus", "Sigismund", "Casimir", "Ludwig", "Maximilian", "Rudolf", "Leopold",
                "Joseph", "Franz", "Umberto", "Vittorio Emanuele", "Victor Emmanuel", "Amenhotep",
                "Thutmose", "Cleopatra", "Ptolemy", "Antiochus", "Seleucus", "Darius", "Xerxes", "Cyrus",
                "Artaxerxes", "Tiglath-Pileser", "Shalmaneser", "Sargon", "Nebuchadnezzar")

PHONE_CONTEXT = ("call", "Call", "dial", "Dial", "phone", "Phone", "tel", "Tel", "fax", "Fax")

# Abbreviations read by context. (abbreviation without its period, reading before a name,
# reading after a name or number): "St. Louis" -> Saint, "Baker St." -> Street.
CONTEXT_ABBREVIATIONS: dict[str, tuple[str, str]] = {
    "St": ("Saint", "Street"),
    "Dr": ("Doctor", "Drive"),
}
# Titles: read so before a name (their period never ends a sentence).
TITLES = {"Mr": "Mister", "Mrs": "Missus", "Ms": "Miz", "Prof": "Professor", "Sgt": "Sergeant",
          "Capt": "Captain", "Gen": "General", "Rev": "Reverend", "Hon": "Honorable", "Lt": "Lieutenant",
          "Col": "Colonel", "Gov": "Governor", "Sen": "Senator", "Rep": "Representative",
          "Mt": "Mount", "Ft": "Fort", "Pres": "President", "Fr": "Father"}
# Abbreviations read the same everywhere; their period can end a sentence.
WORD_ABBREVIATIONS = {"vs": "versus", "etc": "et cetera", "approx": "approximately", "Jr": "Junior",
                      "Sr": "Senior", "Ave": "Avenue", "Blvd": "Boulevard", "Rd": "Road", "Ln": "Lane",
                      "Dept": "Department", "Inc": "Incorporated", "Ltd": "Limited", "Corp": "Corporation",
                      "Univ": "University", "Jan": "January", "Feb": "February", "Mar": "March",
                      "Apr": "April", "Jun": "June", "Jul": "July", "Aug": "August", "Sep": "September",
                      "Sept": "September", "Oct": "October", "Nov": "November", "Dec": "December"}
# Dotted Latin abbreviations, read as their English meaning.
LATIN_ABBREVIATIONS = {"e.g.": "for example", "i.e.": "that is", "cf.": "compare", "et al.": "and others",
                       "a.k.a.": "also known as", "approx.": "approximately"}
# Written without a period.
BARE_ABBREVIATIONS = {"vs": "versus", "w/": "with", "w/o": "without", "&": "and"}

TLD = ("com", "org", "net", "edu", "gov", "io", "dev", "ai", "app", "co", "uk", "us", "de", "fr", "info",
       "biz", "me", "tv", "ly", "eu", "ca", "au", "jp", "nl", "ch", "se", "xyz", "tech", "site", "online")
URL_SYMBOLS = {".": "dot", "/": "slash", "-": "dash", "_": "underscore", ":": "colon", "@": "at",
               "?": "question mark", "=": "equals", "&": "and", "#": "hash", "~": "tilde", "+": "plus",
               "%": "percent"}

# ---------------------------------------------------------------------------------------------
# handlers

Handler = Callable[[re.Match], Said]
"""A rule's words for its match: a str, or pieces naming the part of the match each says
(`text.aligned`), so that word timestamps give each token of the text its own words."""

_NUM = r"(?:\d{1,3}(?:,\d{3}){1,5}|\d{1,15})"  # 1,234,567 or 1234567
_END = r"(?![\w])"  # nothing word-like straight after
_SENTENCE_END = re.compile(r"\s*$|\s+[A-Z\"']")


def _keep_period(m: re.Match) -> str:
    """"." if the abbreviation that matched also ends its sentence (end of text, or a capital next)."""
    return "." if _SENTENCE_END.match(m.string, m.end()) else ""


def _spell_token(token: str) -> str:
    """A URL or e-mail piece, readable: symbols named, digits one by one, words left to espeak."""
    out = []
    for part in re.split(r"([^A-Za-z0-9]|\d++)", token):
        if not part:
            continue
        if part[0].isdigit():
            out.append(digits(part))
        elif part in URL_SYMBOLS:
            out.append(URL_SYMBOLS[part])
        elif part.isalnum():
            out.append(part)
    return " ".join(out)


def _url(m: re.Match) -> str:
    body = m.group(0)
    body = re.sub(r"^[A-Za-z]{3,5}://", "", body)  # the scheme is not read
    return _spell_token(body.rstrip("/"))


def _email(m: re.Match) -> str:
    return _spell_token(m.group(0))


def _date_words(month: int, day: int, yr: str | None, day_first: bool = False,
                parts: tuple = (None, None, None, None)) -> Pieces | None:
    """parts: the match groups of the month, the day, the year and the "of" (None: the whole)."""
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    name = MONTHS[month - 1]
    g_month, g_day, g_year, g_of = parts
    if day_first:
        out = [(f"the {ordinal(day)}", g_day), (" of", g_of if g_of is not None else g_day), (f" {name}", g_month)]
        return out + ([(" " + year(int(yr)), g_year)] if yr else [])
    out = [(name, g_month), (f" {ordinal(day)}", g_day)]
    return out + ([(", " + year(int(yr)), g_year)] if yr else [])


def _iso_date(m: re.Match) -> Said:
    return _date_words(int(m.group(2)), int(m.group(3)), m.group(1)) or m.group(0)


def _slash_date(m: re.Match) -> Said:
    a, b, y = int(m.group(1)), int(m.group(2)), m.group(3)
    if len(y) == 2:
        y = ("20" if int(y) < 50 else "19") + y
    if a > 12 and b <= 12:  # 25/12/2026 cannot be US month/day
        a, b = b, a
    return _date_words(a, b, y) or m.group(0)


def _month_day(m: re.Match) -> Said:
    return _date_words(MONTH_NAMES[m.group(1)], int(m.group(2)), m.group(3), parts=(1, 2, 3, None)) or m.group(0)


def _day_month(m: re.Match) -> Said:
    g_of = "of" if m.group("of") else None
    words = _date_words(MONTH_NAMES[m.group(3)], int(m.group(1)), m.group(4), day_first=True, parts=(3, 1, 4, g_of))
    if words is None:
        return m.group(0)
    # "the 4th of July": the article is already there
    if m.string[max(0, m.start() - 4):m.start()].lower() == "the ":
        words[0] = (words[0][0][len("the "):], words[0][1])
    return words


def _month_year(m: re.Match) -> Pieces:
    return [(MONTHS[MONTH_NAMES[m.group(1)] - 1], 1), (f" {year(int(m.group(2)))}", 2)]


# espeak-ng says "a.m." as the letters, "am" and "AM" as the word, "a m" as the article: dots.
_MERIDIEM = {"am": "a.m", "pm": "p.m", "a.m.": "a.m", "p.m.": "p.m", "AM": "a.m", "PM": "p.m",
             "A.M.": "a.m", "P.M.": "p.m"}


def _time(m: re.Match) -> Said:
    h, mi, sec, mer = int(m.group(1)), m.group(2), m.group(3), m.group(4)
    if h > 24 or (mi and int(mi) > 59) or (mer and not 1 <= h <= 12):
        return m.group(0)
    if not mi or int(mi) == 0:
        words = cardinal(h) + ("" if mer else (" hundred" if h > 12 or h == 0 else " o'clock"))
        if not mi and not mer:
            return m.group(0)
    elif int(mi) < 10:
        words = f"{cardinal(h)} oh {cardinal(int(mi))}"
    else:
        words = f"{cardinal(h)} {cardinal(int(mi))}"
    if sec:
        words += f" and {cardinal(int(sec))} second" + ("" if int(sec) == 1 else "s")
    clock = (m.start(1), max(m.end(k) for k in (1, 2, 3)))  # "10:30:15" of "10:30:15 am"
    if mer:
        # the final dot, unless the text has one next ("at 7 pm." -> "seven p.m.")
        return [(words, clock), (" " + _MERIDIEM[mer] + ("" if m.string.startswith(".", m.end()) else "."), 4)]
    return words


def _currency(m: re.Match) -> Said:
    sym, neg, int_part, frac, scale = m.group("sym"), m.group("neg"), m.group("int"), m.group("frac"), m.group("scale")
    one, many, sub1, subn = CURRENCIES[sym]
    sign = "minus " if neg else ""
    if scale:
        # "$5 million": "five" says "$5", "million dollars" says "million" (the currency word
        # goes with the token it follows, so that each token's words are one run)
        amount = (m.start(), m.end("frac") if frac else m.end("int"))
        return [(f"{sign}{decimal(int_part, frac)}", amount), (f" {SCALES[scale]} {many}", "scale")]
    if len(int_part) > 15:  # digit by digit, then the currency
        return f"{sign}{decimal(int_part, frac)} {many}"
    whole = int(int_part.replace(",", ""))
    if frac is not None and len(frac) == 2 and sub1:
        cents = int(frac)
        parts = []
        if whole:
            parts.append(f"{cardinal(whole)} {one if whole == 1 else many}")
        if cents or not whole:
            parts.append(f"{cardinal(cents)} {sub1 if cents == 1 else subn}")
        return sign + " and ".join(parts)
    return f"{sign}{decimal(int_part, frac)} {one if _is_one(int_part, frac) else many}"


def _ordinal(m: re.Match) -> str:
    return ordinal(int(m.group(1).replace(",", "")))


def _fraction_words(num: int, den: int) -> str:
    if den in FRACTIONS:
        name = FRACTIONS[den][0 if num == 1 else 1]
    else:
        name = ordinal(den) + ("" if num == 1 else "s")
    return f"{cardinal(num)} {name}"


def _fraction(m: re.Match) -> Said:
    num, den = int(m.group(2)), int(m.group(3))
    if den == 0 or den > 100:
        return m.group(0)
    words = _fraction_words(num, den)
    if m.group(1):
        return [(f"{cardinal(int(m.group(1)))} and", 1), (f" {words}", (m.start(2), m.end(3)))]
    return words


def _vulgar(m: re.Match) -> Said:
    words = _fraction_words(*VULGAR[m.group(2)])
    if m.group(1):
        return [(f"{cardinal(int(m.group(1)))} and", 1), (f" {words}", 2)]
    return words


def _year_in_context(m: re.Match) -> Pieces:
    return [(m.group(1), 1), (f" {year(int(m.group(2)))}", 2)]


def _year_range(m: re.Match) -> str:
    return f"{year(int(m.group(1)))} to {year(int(m.group(2)))}"


def _unit_words(unit: str | None, singular: bool) -> str:
    if not unit:
        return ""
    one, many = UNITS[unit]
    return " " + (one if singular else many)


def _range(m: re.Match) -> Pieces:
    a = decimal(m.group("a"), m.group("af"), bool(m.group("neg")))
    b = decimal(m.group("b"), m.group("bf"))
    numbers = (m.start(), m.end("bf") if m.group("bf") else m.end("b"))
    return [(f"{a} to {b}", numbers), (_unit_words(m.group("unit"), False), "unit")]


def _quantity(m: re.Match) -> Pieces:
    int_part, frac = m.group("int"), m.group("frac")
    words = decimal(int_part, frac, bool(m.group("neg")))
    number = (m.start(), m.end("frac") if frac else m.end("int"))
    return [(words, number), (_unit_words(m.group("unit"), _is_one(int_part, frac)), "unit")]


def _number_sign(m: re.Match) -> str:
    return "number " + cardinal(int(m.group(1).replace(",", "")))


def _number(m: re.Match) -> str:
    return decimal(m.group("int"), m.group("frac"), bool(m.group("neg")))


def _long_digits(m: re.Match) -> str:
    return digits(m.group(0))


_ROMAN_VALUES = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}


def roman_value(s: str) -> int:
    total = 0
    for a, b in zip(s, s[1:] + " "):
        v = _ROMAN_VALUES[a]
        total += -v if b != " " and _ROMAN_VALUES[b] > v else v
    return total


def _roman_keyword(m: re.Match) -> Said:
    if not m.group(2):  # every part of the numeral pattern is optional: an empty match
        return m.group(0)
    return [(m.group(1), 1), (f" {cardinal(roman_value(m.group(2)))}", 2)]


def _roman_regnal(m: re.Match) -> Said:
    if not m.group(2):
        return m.group(0)
    numeral = (m.start(2), m.end(3) if m.group(3) else m.end(2))  # "VIII's"
    return [(m.group(1), 1), (f" the {ordinal(roman_value(m.group(2)))}" + (m.group(3) or ""), numeral)]


def _context_abbreviation(m: re.Match) -> Pieces:
    prev = m.group("prev")
    return ([(prev, "prev")] if prev else []) + [((" " if prev else "") + _context_reading(m), "abbr")]


def _context_reading(m: re.Match) -> str:
    before_name, after_name = CONTEXT_ABBREVIATIONS[m.group("abbr")]
    prev, nxt = m.group("prev"), m.group("next")
    if prev in _NOT_NAMES:  # "The St. Lawrence", "Visit St. Louis": a sentence word, not a street
        return before_name if nxt else after_name + _keep_period(m)
    # after a capitalised word or a house number ("Baker St.", "221B Baker St.", "5th St.") it
    # is the street; before a capitalised name ("St. Louis", "Dr. Smith") the title
    if prev and nxt and _SENTENCE_STARTERS.match(m.string, m.end()):
        return after_name + "."  # "Elm Dr. Then we ...": the street ends a sentence
    if prev and not nxt:
        return after_name + _keep_period(m)
    if nxt:
        return before_name
    return after_name + _keep_period(m)


def _title(m: re.Match) -> str:
    return TITLES[m.group(1)]


def _word_abbreviation(m: re.Match) -> str:
    return WORD_ABBREVIATIONS[m.group(1)] + _keep_period(m)


def _latin(m: re.Match) -> str:
    return LATIN_ABBREVIATIONS[m.group(1)] + _keep_period(m)


def _bare(m: re.Match) -> str:
    return BARE_ABBREVIATIONS[m.group(1) or m.group(2)]


def _phone(m: re.Match) -> Pieces:
    names = [g for g in ("cc", "a" if m.group("a") else "a2", "b", "c") if m.group(g)]
    return [((", " if k else "") + ("plus " if g == "cc" else "") + digits(m.group(g)), g) for k, g in enumerate(names)]


def _local_phone(m: re.Match) -> Pieces:
    return [(m.group(1) + m.group(2), 1), (digits(m.group(3)), 3), (", " + digits(m.group(4)), 4)]


def _international_phone(m: re.Match) -> Pieces:
    groups = list(re.finditer(r"\d+", m.group(0)))
    return [(("plus " if k == 0 else ", ") + digits(g.group(0)), (m.start() + g.start(), m.start() + g.end()))
            for k, g in enumerate(groups)]


def _decade(m: re.Match) -> str:
    text = m.group(0)
    if text.startswith("'") or m.group(1) is None:
        return _plural_word(cardinal(int(m.group(2) + "0")))
    return _plural_word(year(int(m.group(1) + m.group(2) + "0")))


# words whose capital makes the St./Dr. rule's "prev" a sentence word, not a street name
_SENTENCE_STARTERS = re.compile(r"\s(?:The|Then|He|She|It|We|They|I|A|An|This|That|There|But|And|So|You)\b")
_NOT_NAMES = frozenset("The A An In On At To From Of And Or For With By Near Visit Saw Met".split())


def _alt(words) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


_ROMAN = r"(?=[MDCLXVI])M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})"
_ROMAN2 = r"(?=[MDCLXVI]{2}|[VX]\b)" + _ROMAN[len("(?=[MDCLXVI])"):]  # II, IV, V, X, ... (not "I")
_ROMAN_NOT_LETTER = r"(?![CDLM]\b)"  # "Appendix C", "Part D", "Class M" are letters, not 100, 500, 1000
_CAP = r"[A-Z][a-z]{1,30}"

class Rule(NamedTuple):
    pattern: re.Pattern
    handler: Handler
    examples: tuple[str, ...]
    """Texts the rule rewrites: tests/text/test_caption_words.py checks that each one's word
    timestamps name the text's own tokens."""


def _rule(pattern: str, handler: Handler, *examples: str) -> Rule:
    return Rule(re.compile(pattern), handler, examples)


# applied in order over the whole text
_RULES: list[Rule] = [
    # e-mail and URLs first: their dots, digits and hyphens are not numbers or sentence ends
    _rule(r"(?<![\w.@+-])[A-Za-z0-9][\w.+-]{0,63}+@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){1,8}+(?<![.-])", _email,
          "Write to jane.doe42@example.com today."),
    _rule(r"(?<![\w./@-])(?:[A-Za-z]{3,5}://[\w-]{1,63}(?:\.[\w-]{1,63}){0,8}+|(?:[A-Za-z0-9][\w-]{0,62}\.){1,8}(?:" + _alt(TLD) + r")(?![\w-]))"
          r"(?::\d{1,5})?(?:[/?#][\w\-./?=&%#~+:]{0,200}(?<![.?:]))?", _url,
          "See https://docs.example.org/v2/setup for more.", "Visit example.com now."),
    # phone numbers before ranges and negatives: "555-123-4567", "+1 (555) 123-4567"
    _rule(r"(?<![\w+(])(?:\+(?P<cc>\d{1,3})\s?)?(?:\((?P<a>\d{3})\)\s?|(?P<a2>\d{3})[-.])(?P<b>\d{3})[-.](?P<c>\d{4})(?![\w-])",
          _phone, "Call +1 (555) 123-4567 now.", "It is 555-123-4567."),
    # a seven-digit local number, only after a word that says it is one ("call 555-0199")
    _rule(r"\b(" + _alt(PHONE_CONTEXT) + r")(:? )(\d{3})-(\d{4})(?![\w-])", _local_phone, "Please call 555-0199 today."),
    # other international numbers: "+44 20 7946 0958", group by group
    _rule(r"(?<![\w+])\+\d{1,3}(?:[ .-]\(?\d{1,4}\)?){2,5}+(?![\w-])", _international_phone, "Ring +44 20 7946 0958 soon."),
    # dates and times
    _rule(r"(?<![\w.-])(\d{4})-(\d{2})-(\d{2})(?![\w-])", _iso_date, "Due 2026-12-07 at noon."),
    _rule(r"(?<![\w./])(\d{1,2})/(\d{1,2})/(\d{4}|\d{2})(?![\w/])", _slash_date, "Born 25/12/1990 in Rome."),
    _rule(r"\b(" + _MONTH_ALT + r")\.? (\d{1,2})(?:st|nd|rd|th)?(?:,? (\d{4}))?(?![\w:])", _month_day,
          "Dec. 1, 2026", "On March 3rd we met."),
    _rule(r"(?<![\w.,])(\d{1,2})(?:st|nd|rd|th)? (?:(?P<of>of) )?(" + _MONTH_ALT + r")\b\.?(?:,? (\d{4})(?!\d))?", _day_month,
          "On 4th of July, 1776 they signed.", "It was 1 May 2020."),
    _rule(r"\b(" + _MONTH_ALT + r")\.?,? (\d{4})(?![\w])", _month_year, "Since Sept. 2019 we grew."),
    _rule(r"(?<![\w.:])(\d{1,2}):(\d{2})(?::(\d{2}))?(?:\s?(a\.m\.|p\.m\.|A\.M\.|P\.M\.|am|pm|AM|PM)(?![\w]))?(?![\d:])", _time,
          "Meet at 10:30 am today.", "It ended 14:05:09 sharp."),
    _rule(r"(?<![\w.:])(\d{1,2})()()\s?(a\.m\.|p\.m\.|A\.M\.|P\.M\.|am|pm|AM|PM)(?!\w)", _time, "See you at 5pm, OK?",
          "Doors open 7 p.m. sharp."),
    # money: "$1,234.56", "-$5", "£2.5 million"; past the trillions, digit by digit
    _rule(r"(?<![\w.,])(?P<neg>-)?(?P<sym>[$£€¥])\s?(?P<int>\d{16,}+|" + _NUM + r")" + r"(?:\.(?P<frac>\d{1,15}))?"
          r"(?![\d,]\d|\.\d)(?:\s?(?P<scale>thousand|million|billion|trillion|bn|[kKmMB])(?![\w]))?", _currency,
          "$1.2 million, up 15%", "$5 million", "It costs $1,234.56 now.", "Pay -$5 back.", "$" + "9" * 20),
    # decades and ordinals
    _rule(r"(?<![\w.,'])(?:'|(\d{2}))?(\d)0s(?!\w)", _decade, "Music of the 1990s and '80s."),
    _rule(r"(?<![\w.,])(" + _NUM + r")(?:st|nd|rd|th)(?!\w)", _ordinal, "Our 22nd year."),
    # fractions: "3/4", "1 1/2", "½"; "24/7" and the like are said as words
    _rule(r"(?<![\w./])(" + _alt(SLASH_IDIOMS) + r")(?![\w/])", lambda m: SLASH_IDIOMS[m.group(1)], "Open 24/7 here."),
    _rule(r"(?<![\w./])(?:(\d{1,3}) )?(\d{1,3})/(\d{1,3})(?![\w/]|\.\d)", _fraction, "Add 1 1/2 cups.", "About 3/4 done."),
    _rule(r"(?<![\w.])(?:(\d{1,3}) ?)?([" + "".join(VULGAR) + r"])", _vulgar, "Add 2 ½ cups.", "Take ¾ now."),
    # years: "in 1990", "1990-2000"
    _rule(r"\b(" + _alt(YEAR_CONTEXT) + r") (1\d{3}|20\d{2})(?![\w,.]?\d|\s?(?:" + _UNIT_ALT + r")(?![\w/]))",
          _year_in_context, "Built in 1905 by hand."),
    _rule(r"(?<![\w.,-])(1\d{3}|20\d{2})[-–](1\d{3}|20\d{2})(?![\w.,]?\d)", _year_range, "The war of 1939-1945 ended."),
    # ranges and quantities with units: "10-20 km", "5 km", "-3.5°C", "45%"
    _rule(r"(?<![\w.,-])(?P<neg>-)?(?P<a>" + _NUM + r")(?:\.(?P<af>\d{1,15}))?[-–](?P<b>" + _NUM + r")(?:\.(?P<bf>\d{1,15}))?" +
          r"(?![\w-]|[.,]\d)(?:\s?(?P<unit>" + _UNIT_ALT + r")(?![\w/]))?", _range, "Walk 10-20 km daily.", "Pages 5-9."),
    _rule(r"(?:(?<![\w.,-])(?P<neg>-))?(?<![\w.,])(?P<int>" + _NUM + r")(?:\.(?P<frac>\d{1,15}))?"
          r"\s?(?P<unit>" + _UNIT_ALT + r")(?![\w/])", _quantity, "It is -3.5 °C and 1 km away.", "Up 45% at 60 mph."),
    # a house number with a letter: "221B" -> "two hundred twenty-one B"
    _rule(r"(?<![\w.,])(\d{1,5})([A-Z])(?!\w)", lambda m: f"{cardinal(int(m.group(1)))} {m.group(2)}", "He lived at 221B then."),
    # "#1", "No. 5"
    _rule(r"(?<![\w&])#(" + _NUM + r")(?![\w]|[.,]\d)", _number_sign, "We are #1 again."),
    _rule(r"\b(?:No|Nos|no)\. ?(?=\d)", lambda m: "number ", "Symphony No. 5 plays."),
    # any other number: "-12", "3.5", "1,234"
    _rule(r"(?:(?<![\w.,-])(?P<neg>-))?(?<![\w.,])(?P<int>" + _NUM + r")(?:\.(?P<frac>\d{1,15}))?(?![\w]|[.,]\d)", _number,
          "It has 1,234 cats, -12 dogs and 3.5 fish.", "Agent 007 called."),
    _rule(r"(?<!\d)\d{16,}+", _long_digits, "Card 1234567890123456789 expired."),
    # Roman numerals, only where unambiguous
    _rule(r"\b(" + _alt(ROMAN_KEYWORDS) + r") " + _ROMAN_NOT_LETTER + "(" + _ROMAN + r")\b(?!-)", _roman_keyword,
          "Read Chapter IV first.", "After World War II ended."),
    _rule(r"\b(" + _alt(REGNAL_NAMES) + r") (" + _ROMAN2 + r")\b('s)?(?![\w'-])", _roman_regnal,
          "Henry VIII's wives.", "Pope John Paul II spoke."),
    _rule(r"\b(" + _alt(REGNAL_NAMES) + r") (I)()(?=[,.;:!?)]|$| of\b| and\b)", _roman_regnal, "Elizabeth I of England."),
    # abbreviations
    _rule(r"(?<![\w.])(" + _alt(LATIN_ABBREVIATIONS) + r")(?![\w])", _latin, "Fruit, e.g. apples.", "Smith et al. wrote it."),
    _rule(r"(?:(?P<prev>" + _CAP + r"|\d{1,5}[A-Za-z]?|\d{1,5}(?:st|nd|rd|th)|[A-Z]{2,20})\s)?\b(?P<abbr>" + _alt(CONTEXT_ABBREVIATIONS) +
          r")\.(?:(?=\s(?P<next>[A-Z]))|(?!\w))", _context_abbreviation, "Dr. Smith lives on Baker St. now.",
          "We met St. Louis fans."),
    _rule(r"\b(" + _alt(TITLES) + r")\.(?=\s[A-Z])", _title, "Mr. Jones met Prof. Lee."),
    _rule(r"\b(" + _alt(WORD_ABBREVIATIONS) + r")\.(?!\w)", _word_abbreviation, "Apples, pears, etc. are fruit.",
          "Acme Inc. sells."),
    _rule(r"(?<![\w/])(vs|w/o|w/)(?=\s)|(?<=\s)(&)(?=\s)", _bare, "Tea w/o sugar vs coffee & cream."),
]


def normalize_text(text: str, language: str = "en") -> str:
    """The spoken form of `text` for an English voice (`language` "en", "en-us", "en-gb", ...).

    Numbers, money, dates, times, decades, years, units, ordinals, fractions, phone numbers,
    URLs and e-mail addresses, Roman numerals after "Chapter" or a regnal name, and common
    abbreviations become words. Text with none of these is returned unchanged; so is any text
    for another language (its voices read it as written).
    """
    return normalize_text_aligned(Aligned.of(text), language).text


def normalize_text_aligned(text: Aligned, language: str = "en") -> Aligned:
    """`normalize_text`, each character carrying the span of the input it says."""
    if not language.lower().startswith("en"):
        return text
    for rule in _RULES:
        text = text.sub(rule.pattern, rule.handler)
    return text
