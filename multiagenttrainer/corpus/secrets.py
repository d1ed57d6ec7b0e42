"""Secret redaction: a documented rule set behind a literal pre-filter.

Every rule lists literal strings ("triggers") that any secret it finds contains or adjoins. One
Aho-Corasick pass (ahocorasick_rs, SIMD-accelerated) finds all triggers of a file; a file
without any costs nothing more. Each hit runs only its own rules, and only at the hit: token
rules match at the hit's position; assignment rules first check that an assignment follows the
name (one short regex), then match the name and its value from where the name starts. The
secret value is replaced by `<REDACTED:rule>`; the syntax around it (quotes, keys, the rest of
the line) is kept.

Rules (name: what is redacted):
  private-key         the body of a -----BEGIN ... PRIVATE KEY----- block (BEGIN/END lines kept),
                      also inside a JSON string (`\\n` escapes)
  <provider tokens>   22 formats with documented prefixes and lengths: see secret_formats.py
  authorization       the credentials of an Authorization header (Bearer, Basic, token, Bot, ...)
                      in any syntax: HTTP, curl -H, JSON, dicts, escaped JSON
  bearer-token        a generated-looking value after `Bearer ` anywhere else
  url-credentials     the password in scheme://user:password@host and scheme://:password@host
  aws-secret-key      a 40-character value assigned to aws_secret_access_key, SecretAccessKey, ...
  netrc               the password of a .netrc entry (machine HOST login USER password SECRET)
  secret-assignment   a value assigned to a credential-named key in any syntax: `=`, `:`, `:=`,
                      `=>` (code, .env, shell, INI, TOML, YAML, JSON, .npmrc, connection strings
                      such as `Password=...;`), YAML block scalars (`password: |` / `>-` and the
                      indented lines below), JSON-escaped strings (`\\"password\\": \\"...\\"` in a
                      notebook's source), XML attributes (`password="..."`, `key="Password"
                      value="..."`) and elements (`<password>...</password>`). Names ending in
                      password, passwd, passphrase, pwd, secret, secret_key, private_key (also
                      with _id, _base, _value, _b64, ...), or _pass/-pass: any literal; names
                      ending in token, api_key/apikey, access_key, account_key (AccountKey,
                      SharedAccessKey), -key (x-api-key) or an upper-case name ending in _KEY
                      (`OPENAI_KEY`, `AUTH_KEY`): a literal that looks generated (8+ characters
                      without spaces, with both letters and digits); `_auth` (.npmrc) and `"auth"`
                      (docker's config.json): a base64 value

Names are found in the spellings the triggers cover: lower, UPPER, Capitalised and camelCase
(`apiKey`); `pass` only as a suffix (`DB_PASS`, `smtp-pass`); names ending in token only in
upper case or when a quote, a backslash or the assignment directly follows (`token = ...`,
`"token": ...`).

Placeholders are left alone: values under 4 characters, `${VAR}`, `$(cmd)`, `<...>`, `{{...}}`,
`{name}`, `%(x)s`, masks such as `****` or `xxxx`, and words or parts such as changeme, example,
your_token_here, dummy, redacted (so AWS's documented ...EXAMPLE keys stay). For unquoted values,
code is left alone too: calls, indexing, attribute access (`self.token`, `os.environ[...]`),
numbers, type names, paths, variables (a lowercase or camelCase word without digits, such as
`password = acct`), and the targets of a tuple assignment (`user, password = "a", "b"`).

Not covered: secrets with no name, prefix or header around them (a bare random string), values
split across lines or built by code, and names outside the lists above (`credentials = "..."`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ahocorasick_rs import MATCHKIND_LEFTMOST_LONGEST, BytesAhoCorasick

from multiagenttrainer.corpus.secret_formats import TOKEN_FORMATS

Span = tuple[int, int, str]  # start, end, rule name
Hits = list[tuple[int, int, int]]  # (trigger, start, end) as SCANNER.find_matches_as_indexes gives them
SeenNames = set[tuple[int, str]]  # (name start, rule name) already looked at
Collector = Callable[["Rule", bytes, int, int, list[Span], SeenNames], None]

# ------------------------------------------------------------------ placeholders

PLACEHOLDER_WORDS = frozenset(
    b"none null nil true false undefined changeme change_me password passwd secret token apikey "
    b"api_key example sample placeholder dummy redacted test testing todo tbd fixme string str "
    b"int bool bytes any optional required empty default value mask masked hidden pass".split()
)
PLACEHOLDER_PARTS = (b"your", b"example", b"placeholder", b"redacted", b"changeme", b"dummy", b"xxxx")
TEMPLATED = re.compile(rb"\$\{|\$\(|\{\{|%\(\w*\)[sdr]|%[sdr]|\{\w*\}")  # anywhere in a value
WHOLE_TEMPLATE = re.compile(rb"<[^>]*>|\{[^}]*\}")
BARE_PLACEHOLDER_STARTS = frozenset(b"$%<{[(@*#!&")
MASK_BYTES = frozenset(b"x*.-#_ ")
SECRET_WORDS = (b"password", b"passwd", b"pwd", b"secret", b"token", b"key", b"pass")
CODE_PATH = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
VARIABLE_NAME = re.compile(rb"[a-z_]+(?:[A-Z][a-z_]*)*")  # `acct`, `user_input`, `userInput`: no digits
FILE_PATH = re.compile(rb"(?:~|\.{1,2})?/[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]*)*")
GENERATED_LOOKING = re.compile(rb"(?=[^\s]*[0-9])(?=[^\s]*[A-Za-z])[^\s]{8,}")
BASE64_VALUE = re.compile(rb"[A-Za-z0-9+/]{8,}={0,2}")
MIN_SECRET_LENGTH = 4
MAX_FAST_TRIGGERS = (
    64  # ahocorasick_rs searches with SIMD (Teddy) up to this many patterns, 3x to 7x slower past it
)


def is_placeholder(value: bytes, *, quoted: bool = True) -> bool:
    """Whether a value is obviously not a real secret."""
    value = value.strip()
    lowered = value.lower()
    if len(value) < MIN_SECRET_LENGTH:
        return True
    templated = is_template(value) if quoted else value[0] in BARE_PLACEHOLDER_STARTS
    if templated or lowered in PLACEHOLDER_WORDS or set(lowered) <= MASK_BYTES:
        return True
    if any(part in lowered for part in PLACEHOLDER_PARTS):
        return True
    return not quoted and looks_like_code(value, lowered)


def is_template(value: bytes) -> bool:
    """`${VAR}`, `{{ var }}`, `%s:%s`, `<your key>`, `{name}`: a value filled in later."""
    return TEMPLATED.search(value) is not None or WHOLE_TEMPLATE.fullmatch(value) is not None


def looks_like_code(value: bytes, lowered: bytes) -> bool:
    """An unquoted value that is an expression, a variable or a path rather than a literal."""
    if any(c in value for c in b"()[]") or value.isdigit() or FILE_PATH.fullmatch(value):
        return True
    if VARIABLE_NAME.fullmatch(value):
        return True
    if CODE_PATH.fullmatch(value) is None:
        return False
    return b"." in value or any(word in lowered for word in SECRET_WORDS)


def looks_generated(value: bytes) -> bool:
    """8+ characters without spaces, with both letters and digits: a key rather than a word."""
    return GENERATED_LOOKING.fullmatch(value) is not None


# ------------------------------------------------------------------ rules


@dataclass(frozen=True)
class Rule:
    """A kind of secret: where the pre-filter triggers, how to find the value, what replaces it."""

    name: str
    triggers: tuple[bytes, ...]
    pattern: re.Pattern[bytes]
    collect: Collector
    offset: int = 0  # token rules: where the token starts relative to the trigger
    word_start: bool = True  # token rules: the token may not continue a longer word
    requires: bytes = b""  # a byte every match contains: in a file without it, hits are not looked at
    accept: Callable[[re.Match[bytes]], bool] | None = None  # token rules: a last check of the match
    marker: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "marker", b"<REDACTED:" + self.name.encode() + b">")


def collect_token(rule: Rule, data: bytes, start: int, end: int, spans: list[Span], _seen: SeenNames) -> None:
    """A self-describing token at the trigger (shifted by the rule's offset)."""
    begin = start + rule.offset
    if begin < 0 or (rule.word_start and begin > 0 and data[begin - 1 : begin].isalnum()):
        return
    match = rule.pattern.match(data, begin)
    if match is None or (rule.accept is not None and not rule.accept(match)):
        return
    secret = match.span("secret") if "secret" in rule.pattern.groupindex else match.span()
    if not is_placeholder(data[secret[0] : secret[1]]):
        spans.append((secret[0], secret[1], rule.name))


def accept_authorization(match: re.Match[bytes]) -> bool:
    """Basic: base64; other schemes: a generated-looking value; none: 16+ of them, quoted or a header."""
    scheme, value = match.group("scheme"), match.group("secret")
    if scheme is not None and scheme.lower() == b"basic":
        return BASE64_VALUE.fullmatch(value) is not None
    if scheme is not None:
        return looks_generated(value)
    header_or_quoted = match.group("op") == b":" or match.group("quote") is not None
    return header_or_quoted and len(value) >= 16 and looks_generated(value)


def accept_generated(match: re.Match[bytes]) -> bool:
    """The secret looks generated (letters and digits), not a word."""
    return looks_generated(match.group("secret"))


ASSIGNMENT_FOLLOWS = re.compile(  # an operator, an XML `" value=`, or an XML element's `>`
    rb"""[A-Za-z0-9_-]{0,32}(?:\\*["']?[ \t]*(?::=|=>|=(?!=)|:(?![:=]))"""
    rb"""|\\*["'][ \t]+(?i:value|content)[ \t]*=|>)"""
)
NAME_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
MAX_NAME_BYTES = 64
VALUE_GROUPS = ("secret", "tdq", "dq", "sq", "bq", "edq", "block", "elem", "bare")


def name_start(data: bytes, start: int) -> int:
    """Where the name that holds the trigger at `start` begins."""
    lowest = max(0, start - MAX_NAME_BYTES)
    while start > lowest and data[start - 1] in NAME_BYTES:
        start -= 1
    return start


MAX_LINE_LOOK = 16384  # no value is longer: the rest of a longer line is not looked at


def line_end_after(data: bytes, position: int) -> int:
    """The end of the line holding `position` (its newline, or the end of the data), at most
    MAX_LINE_LOOK bytes on: hits along a hostile megabyte-long line must not each scan all of it."""
    end = data.find(b"\n", position, position + MAX_LINE_LOOK)
    return min(len(data), position + MAX_LINE_LOOK) if end == -1 else end


def collect_assignment(
    rule: Rule, data: bytes, start: int, end: int, spans: list[Span], seen: SeenNames
) -> None:
    """The value assigned to the name that holds the trigger, if it is assigned one here."""
    while data[start] not in NAME_BYTES:  # a trigger that opens with a quote: `"auth"`
        start += 1
    if ASSIGNMENT_FOLLOWS.match(data, start) is None:
        return  # `tokenizer.encode(...)`, `if password:`, prose: nothing assigned here
    begin = name_start(data, start)
    if (begin, rule.name) in seen:
        return
    seen.add((begin, rule.name))
    line_end = line_end_after(data, start)
    match = rule.pattern.match(data, begin, line_end)
    if match is None:
        return
    group = next(g for g in VALUE_GROUPS if g in rule.pattern.groupindex and match.start(g) != -1)
    if group == "block":
        span = block_scalar(data, begin, line_end) if match.group("op") == b":" else None
        if span is not None and is_named_secret(match, data[span[0] : span[1]], quoted=True):
            spans.append((span[0], span[1], rule.name))
    elif is_assigned_secret(match, group, data, begin, line_end):
        spans.append((match.start(group), match.end(group), rule.name))


TUPLE_TARGETS = re.compile(rb"[ \t]*[A-Za-z0-9_.]+(?:[ \t]*,[ \t]*[A-Za-z0-9_.]+)*[ \t]*,[ \t]*")


def is_tuple_target(data: bytes, begin: int) -> bool:
    """`user, password = ...`: the name is one of several targets, so the value is not its own."""
    line_start = data.rfind(b"\n", 0, begin) + 1
    return (
        data[begin - 1 : begin] in (b",", b" ")
        and TUPLE_TARGETS.fullmatch(data, line_start, begin) is not None
    )


def is_assigned_secret(match: re.Match[bytes], group: str, data: bytes, begin: int, line_end: int) -> bool:
    """Whether an assignment's value is a secret rather than a placeholder, code or prose."""
    if group == "elem" and data[begin - 1 : begin] != b"<":
        return False  # `password>...` outside an XML element
    if is_tuple_target(data, begin):
        return False
    if group == "bare" and match.group("op") == b":" and is_prose_or_annotation(data[match.end() : line_end]):
        return False  # `name: words and more words` is prose, `name: Type = ...` an annotation
    return is_named_secret(match, match.group(group), quoted=group != "bare")


def is_prose_or_annotation(rest_of_line: bytes) -> bool:
    """After `name: word`: more words, or `= default`, rather than the end of a YAML value."""
    following = rest_of_line.lstrip()[:1]
    return following.isalnum() or following == b"="


def is_named_secret(match: re.Match[bytes], value: bytes, *, quoted: bool) -> bool:
    """Whether the value of a credential-named key is a secret, by what the name asks of it."""
    groups = match.re.groupindex
    if "auth" in groups and match.group("auth") is not None and BASE64_VALUE.fullmatch(value) is None:
        return False
    if "weak" in groups and match.group("weak") is not None and not looks_generated(b"".join(value.split())):
        return False
    return not is_placeholder(value, quoted=quoted)


MAX_BLOCK_LINES = 100


def block_scalar(data: bytes, name_at: int, line_end: int) -> tuple[int, int] | None:
    """The span of a YAML block scalar's lines (indented deeper than its key), from the first
    character to the end of the last non-blank line; None when there are none."""
    column = name_at - (data.rfind(b"\n", 0, name_at) + 1)
    first = last = -1
    position = line_end + 1
    for _ in range(MAX_BLOCK_LINES):
        if position >= len(data):
            break
        end = line_end_after(data, position)
        line = data[position:end].rstrip(b"\r")
        content = line.lstrip(b" \t")
        if content:
            if len(line) - len(content) <= column:
                break
            first = position + len(line) - len(content) if first < 0 else first
            last = position + len(line)
        position = end + 1
    return (first, last) if first >= 0 else None


NOT_BASE64 = re.compile(rb"[^A-Za-z0-9+/=]")
MIN_KEY_BODY_CHARS = 32
MAX_KEY_BYTES = 16384  # an END line further on than this is not this block's


def collect_key_block(
    rule: Rule, data: bytes, start: int, end: int, spans: list[Span], _seen: SeenNames
) -> None:
    """The body of a PEM private key block whose BEGIN line holds the trigger, up to its END line
    (or the end of the data, when that is near)."""
    begin = data.rfind(b"-----BEGIN", max(0, start - 64), start)
    end_at = data.find(b"-----END", end, end + MAX_KEY_BYTES)
    if begin == -1 or (end_at == -1 and len(data) > end + MAX_KEY_BYTES):
        return
    match = rule.pattern.match(data, begin, len(data) if end_at == -1 else end_at)
    if match is None:
        return
    body = match.group("secret")
    if len(NOT_BASE64.sub(b"", body)) < MIN_KEY_BODY_CHARS:
        return  # a mention of the format, or an empty template
    inner_start = match.start("secret") + body.find(body.strip())
    spans.append((inner_start, inner_start + len(body.strip()), rule.name))


NETRC_KEYWORD = re.compile(rb"(?<!\S)(?:machine|default)(?=\s)")
NETRC_ENTRY = re.compile(
    rb"(?:machine\s+\S+|default)(?:\s+(?:login|account|port)\s+\S+)*"
    rb"\s+(?P<keyword>password)[ \t]+(?P<secret>\S+)"
)
NETRC_VALUE_FOLLOWS = re.compile(rb"[ \t]+[^\s=:]")
NETRC_WINDOW = 256  # how far before `password` its entry's `machine` may be


def collect_netrc(rule: Rule, data: bytes, start: int, end: int, spans: list[Span], _seen: SeenNames) -> None:
    """The password of a .netrc entry: `machine HOST [login USER] password SECRET`."""
    begin = start - 2  # the trigger is "ssw"
    if data[begin : begin + 8] != b"password" or not data[begin - 1 : begin].isspace():
        return
    if NETRC_VALUE_FOLLOWS.match(data, begin + 8) is None:
        return  # `password = ...`, `password:`: an assignment, not a .netrc entry
    for keyword in NETRC_KEYWORD.finditer(data, max(0, begin - NETRC_WINDOW), begin):
        match = NETRC_ENTRY.match(data, keyword.start())
        if match is not None and match.start("keyword") == begin:
            value = match.group("secret")
            if not is_placeholder(value) and value[0] not in b"$%<{":
                spans.append((match.start("secret"), match.end("secret"), rule.name))
            return


OPERATOR = (
    rb"""(?:(?:\\*["'])?[ \t]*(?P<op>:=|=>|=(?!=)|:(?![:=]))|\\*["'][ \t]+(?:value|content)[ \t]*=)[ \t]*"""
)
VALUE = (  # a string in any quotes (escapes allowed, or itself escaped), a block scalar, or a bare word
    rb'''(?:"""(?P<tdq>[^\n]{0,4096}?)"""|"(?P<dq>(?:[^"\\\n]|\\.){0,8192})"|'(?P<sq>(?:[^'\\\n]|\\.){0,8192})\''''
    rb'''|`(?P<bq>[^`\n]{0,4096})`|(?P<esc>\\{1,8})"(?P<edq>[^"\n]{0,8192}?)(?P=esc)"'''
    rb"""|(?P<block>[|>][-+0-9]{0,2})[ \t]*(?=\#|$)"""
    rb"""|(?P<bare>[^\s"'`,;)\]}<>\\]{1,1024}))"""
)
ELEMENT = rb">(?P<elem>[^<\n]{1,256})</"
STRONG_NAME = (
    rb"(?:password|passwd|passphrase|pwd|secret(?:[_-]?key)?|private[_-]?key(?:[_-]?id)?|(?<=[_-])pass)"
    rb"(?:[_-]?(?:base|base64|b64|value|hex|raw))?"
)
WEAK_NAME = (
    rb"token|api[_-]?key|access[_-]?key|auth[_-]?key|account[_-]?key|(?-i:[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_KEY)"
)
AUTH_NAME = rb"(?<![A-Za-z0-9_.-])_?auth"
NAME_START = rb"(?:(?<![A-Za-z0-9_.:/-])|(?<=:)(?=_))[A-Za-z0-9_.-]*?"
AWS_SECRET_NAME = rb"(?:(?:aws[_-]?)?secret[_-]?access[_-]?key|aws[_-]?secret[_-]?key)"

# Triggers for names are fragments that cover their spellings (`ssw`: password, Password, passwd;
# `piKey`: apiKey, ApiKey). The automaton stays SIMD-fast (Teddy) only up to 64 triggers in all,
# and only while every trigger has 3 bytes or more whose first 3 are rare in code: its candidates
# are the positions where some trigger's first 3 bytes match, so `ssw` rather than `assw` ("class"),
# `rization` rather than `uthorization` ("auth"), `rer ` rather than `earer ` ("clear", "year").
# "token" is everywhere in code (tokenizers, parsers, pagination), so it triggers only when a
# quote, a backslash (escaped JSON) or an assignment follows it, or in upper case (`API_TOKEN`).
SECRET_TRIGGERS = (b"ecret", b"ECRET")
PASSWORD_TRIGGERS = (b"ssw", b"SSW")
ASSIGNMENT_TRIGGERS = (
    SECRET_TRIGGERS
    + PASSWORD_TRIGGERS
    + (b"pwd", b"Pwd", b"PWD", b"_pass", b"_PASS", b"-pass")
    + (b'oken"', b"oken'", b"oken=", b"oken =", b"oken:", b"oken :", b"oken\\", b"OKEN")
    + (b"pi_key", b"pikey", b"piKey", b"-key", b"-Key", b"_KEY")
    + (b"ccess_key", b"ccessKey", b"ccount_key", b"ccountKey", b"rivate_key", b"rivateKey")
    + (b'"auth"', b"_auth=")
)


def assignment_pattern() -> re.Pattern[bytes]:
    """A credential-named key, then its value: assigned, an XML attribute pair or an XML element."""
    names = rb"(?:" + STRONG_NAME + rb"|(?P<weak>" + WEAK_NAME + rb")|(?P<auth>" + AUTH_NAME + rb"))"
    return re.compile(
        rb"(?i)" + NAME_START + names + rb"(?![A-Za-z0-9_.-])(?:" + OPERATOR + VALUE + rb"|" + ELEMENT + rb")"
    )


def token_rule(name: str, triggers: tuple[bytes, ...], pattern: re.Pattern[bytes], offset: int = 0) -> Rule:
    """A token rule for a provider format."""
    return Rule(name, triggers, pattern, collect_token, offset=offset)


RULES: tuple[Rule, ...] = (
    Rule(
        "private-key",
        (b"PRIVATE KEY",),
        re.compile(
            rb"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?P<secret>.*)\Z",
            re.S,
        ),
        collect_key_block,
    ),
    *(
        Rule(f.name, f.triggers, f.pattern, collect_token, offset=f.offset, word_start=f.word_start)
        for f in TOKEN_FORMATS
    ),
    Rule(
        "authorization",
        (b"rization",),
        re.compile(
            rb"""(?i:authorization)\\*["']?[ \t]*(?P<op>[:=])[ \t]*(?P<quote>\\*["'])?[ \t]*"""
            rb"""(?:(?P<scheme>(?i:bearer|basic|token|bot|apikey|api-key|sso-key))[ \t]+)?"""
            rb"""(?P<secret>[A-Za-z0-9_.~+/-]{1,1024}=*)(?![A-Za-z0-9_.~+/=(\[-])"""
        ),
        collect_token,
        offset=-5,
        accept=accept_authorization,
    ),
    Rule(
        "bearer-token",
        (b"rer ",),
        re.compile(rb"[Bb]earer[ \t]+(?P<secret>[A-Za-z0-9_.~+/-]{16,1024}=*)(?![A-Za-z0-9_.~+/=(\[-])"),
        collect_token,
        offset=-3,
        accept=accept_generated,
    ),
    Rule(
        "url-credentials",
        (b"://",),
        re.compile(rb"""://[^\s:/?#@"'`<>\\]{0,256}:(?P<secret>[^\s/?#@"'`<>\\]{1,256})@"""),
        collect_token,
        word_start=False,
        requires=b"@",  # URLs are everywhere in code and docs; ones with credentials are rare
    ),
    Rule(
        "aws-secret-key",
        SECRET_TRIGGERS,
        re.compile(
            rb"(?i)"
            + NAME_START
            + AWS_SECRET_NAME
            + OPERATOR
            + rb"""\\*["']?(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"""
        ),
        collect_assignment,
    ),
    Rule("netrc", (b"ssw",), NETRC_ENTRY, collect_netrc),
    Rule("secret-assignment", ASSIGNMENT_TRIGGERS, assignment_pattern(), collect_assignment),
)
RULE_ORDER = {rule.name: index for index, rule in enumerate(RULES)}


def ruleset_digest(rules: tuple[Rule, ...] = RULES) -> str:
    """A hash of the rules' names, triggers and patterns: a corpus built with other rules is stale."""
    digest = hashlib.sha1(usedforsecurity=False)
    for rule in rules:
        digest.update(b"\0".join((rule.name.encode(), *rule.triggers, rule.pattern.pattern, b"\n")))
    return digest.hexdigest()


RULESET_DIGEST = ruleset_digest()


def _build_scanner() -> tuple[BytesAhoCorasick, list[tuple[Rule, ...]]]:
    """One automaton over every trigger; each trigger maps to the rules it can start."""
    rules_for: dict[bytes, list[Rule]] = {}
    for rule in RULES:
        for trigger in rule.triggers:
            rules_for.setdefault(trigger, []).append(rule)
    triggers = list(rules_for)
    return BytesAhoCorasick(triggers, matchkind=MATCHKIND_LEFTMOST_LONGEST), [
        tuple(rules_for[t]) for t in triggers
    ]


SCANNER, TRIGGER_RULES = _build_scanner()


def _required_byte(rules: tuple[Rule, ...]) -> int:
    """The byte (as an int) every rule of a trigger requires in the file, or -1 when there is none."""
    needs = {rule.requires for rule in rules}
    return needs.pop()[0] if len(needs) == 1 and b"" not in needs else -1


# Per trigger: the first of its rules in RULES order (splice prefers earlier rules).
TRIGGER_RANK = tuple(min(RULE_ORDER[rule.name] for rule in rules) for rules in TRIGGER_RULES)
# Per trigger: the byte its rules need somewhere in the file, or -1 (the native encoder reads this too).
TRIGGER_REQUIRES = tuple(_required_byte(rules) for rules in TRIGGER_RULES)
REQUIRED_BYTES = frozenset(required for required in TRIGGER_REQUIRES if required >= 0)


def relevant_hits(data: bytes, hits: Hits) -> Hits:
    """The hits whose rules could match in this file (e.g. no URL credentials in a file without `@`)."""
    missing = {byte for byte in REQUIRED_BYTES if data.find(byte) < 0}
    if not missing:
        return hits
    return [hit for hit in hits if TRIGGER_REQUIRES[hit[0]] not in missing]


def redact_secrets(data: bytes, hits: Hits | None = None) -> tuple[bytes, dict[str, int]]:
    """The data with every secret value replaced by `<REDACTED:rule>`, and how many per rule.

    `hits`: SCANNER's matches in data, when the caller has them already.
    """
    if hits is None:
        hits = SCANNER.find_matches_as_indexes(data)
    hits = relevant_hits(data, hits) if hits else hits
    spans = collect_spans(data, hits) if hits else []
    return splice(data, spans) if spans else (data, {})


def collect_spans(data: bytes, hits: Hits) -> list[Span]:
    """What each hit's rules find at it. A hit inside a span found already is passed over unless
    one of its rules comes first in RULES (splice would drop what it finds): this also keeps
    hostile input linear (`xoxb-xoxb-xoxb-...` along a megabyte line is one token)."""
    spans: list[Span] = []
    seen: SeenNames = set()
    covered, cover_rank = 0, 0  # where the spans so far end, and the rank of the rule that got there
    for trigger, start, end in hits:
        inside = start < covered
        if inside and TRIGGER_RANK[trigger] >= cover_rank:
            continue
        found = len(spans)
        for rule in TRIGGER_RULES[trigger]:
            if not inside or RULE_ORDER[rule.name] < cover_rank:
                rule.collect(rule, data, start, end, spans, seen)
        for _, span_end, name in spans[found:]:
            if span_end > covered:
                covered, cover_rank = span_end, RULE_ORDER[name]
    return spans


def splice(data: bytes, spans: list[Span]) -> tuple[bytes, dict[str, int]]:
    """Replace non-overlapping spans; of overlapping ones the earliest wins, then the rule listed first."""
    pieces: list[bytes] = []
    counts: dict[str, int] = {}
    position = 0
    for start, end, name in sorted(set(spans), key=lambda s: (s[0], RULE_ORDER[s[2]], -s[1])):
        if start < position:
            continue
        pieces += [data[position:start], RULES[RULE_ORDER[name]].marker]
        counts[name] = counts.get(name, 0) + 1
        position = end
    pieces.append(data[position:])
    return b"".join(pieces), counts
