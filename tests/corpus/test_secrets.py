"""Each redaction rule, the placeholders it leaves alone, and planted secrets never reaching the corpus."""

from __future__ import annotations

import dataclasses
import json
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from multiagenttrainer.corpus.secrets import (
    MAX_FAST_TRIGGERS,
    RULES,
    RULESET_DIGEST,
    TRIGGER_RULES,
    redact_secrets,
    ruleset_digest,
)
from tests.corpus.conftest import dir_snapshot, read_jsonl
from tests.support.fake_credentials import FakeCredential, fake_credentials

# Built from pieces so this file does not itself look like it leaks credentials.
AWS_KEY_ID = "AKIA" + "Z3MZ5QWERTY12345"
AWS_SECRET = "k8Hq2Zr7YvP1mN4b" + "T6wX9cF3jL5sD0gA2eR8uI1o"
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
GITHUB_PAT = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123"
SLACK_TOKEN = "xoxb-" + "123456789012-abcdefghijklmnop"
SLACK_HOOK_PATH = "T0123ABCD/B0123ABCD/" + "q8Hn2Zr7YvP1mN4bT6wX9cF3"
GOOGLE_KEY = "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"
STRIPE_KEY = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
JWT = "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0." + "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
KEY_BODY = "MIIEowIBAAKCAQEAx1y2z3abcdefghij\nklmnopqrstuvwxyz0123456789ABCDEF\nGHIJKLMNOP=="
PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\n" + KEY_BODY + "\n-----END RSA PRIVATE KEY-----\n"

POSITIVES = [
    ("aws-access-key", f"aws_access_key_id = {AWS_KEY_ID}\n", AWS_KEY_ID),
    ("aws-access-key", f'"AccessKeyId": "{"ASIA" + "Y3MZ5QWERTY12345"}"\n', "ASIA" + "Y3MZ5QWERTY12345"),
    ("aws-secret-key", f'aws_secret_access_key = "{AWS_SECRET}"\n', AWS_SECRET),
    ("aws-secret-key", f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}\n", AWS_SECRET),
    ("aws-secret-key", f'  "SecretAccessKey": "{AWS_SECRET}",\n', AWS_SECRET),
    ("github-token", f'headers = {{"Authorization": "token {GITHUB_TOKEN}"}}\n', GITHUB_TOKEN),
    ("github-token", f"GH={GITHUB_PAT}\n", GITHUB_PAT),
    ("slack-token", f"slack: {SLACK_TOKEN}\n", SLACK_TOKEN),
    ("slack-webhook", f'url = "https://hooks.slack.com/services/{SLACK_HOOK_PATH}"\n', SLACK_HOOK_PATH),
    ("private-key", PRIVATE_KEY, KEY_BODY),
    ("google-api-key", f'maps_key = "{GOOGLE_KEY}"\n', GOOGLE_KEY),
    ("stripe-key", f"stripe.api_base_key = '{STRIPE_KEY}'\n", STRIPE_KEY),
    ("jwt", f"Authorization: Bearer {JWT}\n", JWT),
    ("url-credentials", "DATABASE_URL=postgres://admin:s3cr3tP4ss@db.internal:5432/app\n", "s3cr3tP4ss"),
    ("secret-assignment", 'password = "hunter2hunter2"\n', "hunter2hunter2"),
    ("secret-assignment", "DB_PASSWORD=Sup3rS3cret\n", "Sup3rS3cret"),
    ("secret-assignment", "SMTP_PASS=Sup3rS3cret\n", "Sup3rS3cret"),
    ("secret-assignment", '  "api_key": "abcd1234efgh5678",\n', "abcd1234efgh5678"),
    ("secret-assignment", 'apiKey: "zzzz9999yyyy"\n', "zzzz9999yyyy"),
    ("secret-assignment", "client_secret: q8Hn2Zr7YvP1mN4b\n", "q8Hn2Zr7YvP1mN4b"),
    ("secret-assignment", "SECRET_KEY = 'django-insecure-4f8a9b2c'\n", "django-insecure-4f8a9b2c"),
    ("secret-assignment", "GITHUB_TOKEN=abc123def456ghi789\n", "abc123def456ghi789"),
    ("secret-assignment", 'db.connect(user="app", password="Tr0ub4dor&3")\n', "Tr0ub4dor&3"),
    ("secret-assignment", "Server=db;User Id=sa;Password=Secr3t!23;\n", "Secr3t!23"),
    ("secret-assignment", 'auth_token := "f00dfeed12345678"\n', "f00dfeed12345678"),
    ("secret-assignment", "'private_key' => 'K3yM4t3r14l'\n", "K3yM4t3r14l"),
]

NEGATIVES = [
    'password = ""\n',
    'password = os.environ["DB_PASSWORD"]\n',
    "password = getpass.getpass()\n",
    "token = self.token\n",
    "token = get_token(user)\n",
    "password: str\n",
    "def login(user: str, password: str) -> None:\n",
    'password = "changeme"\n',
    'SECRET_KEY = "${SECRET_KEY}"\n',
    "api_key: <your-api-key>\n",
    'token = "{token}"\n',
    "password = '********'\n",
    "max_tokens = 512\n",
    'tokenizer = "gpt2-large"\n',
    '"output_token": "NextToken",\n',
    'unk_token = "<unk>"\n',
    'pad_token = "[PAD]"\n',
    'if password == "abcdefgh":\n',
    "pass\n",
    "aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n",
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
    "https://user:password@example.com/\n",
    ":param password: the password to check against the stored hash\n",
    '"Resource": "arn:aws:secretsmanager:*:*:secret:prod-db-*"\n',
    "-----BEGIN PRIVATE KEY-----\n...\n-----END PRIVATE KEY-----\n",
    "ghp_ tokens start with ghp_\n",
    # code and prose around the newer rules
    "userid = passwd = acct = ''\n",
    "self.user, self.password = user, password\n",
    'user, password = "wile", "coyote"\n',
    "conn = connect(user=name, password=secret_value, host=host)\n",
    'USER_PASSWD = "%s:%s" % (USER, PASSWD)\n',
    "PWD=/home/ci/build\n",
    "password: Optional[str] = None\n",
    'headers["Authorization"] = "Bearer " + token\n',
    "headers = {'Authorization': f'Bearer {token}'}\n",
    "Authorization: Bearer $OPENAI_API_KEY\n",
    "authorization = request.headers.get('Authorization')\n",
    "the bearer of the letter\n",
    "from sklearn.model_selection import train_test_split  # scikit-learn, sk-learn\n",
    "path = hf_hub_download(repo_id, filename)\n",
    "key-value pairs, key-0123456789abcdef are not enough\n",
    "secret_name = 'prod/db'\n",
    "db:\n  password: |\n\nnext: 1\n",
    "<password></password>\n",
    "if len(password)>8: ok()\n",
    "machine learning needs a password reset\n",
    "redis://:@localhost:6379\n",
    "REDIS_URL=redis://:${REDIS_PASSWORD}@cache:6379\n",
    '"auth": "basic"\n',
    '<input type="password" name="password" value="">\n',
    "api_key = os.environ['OPENAI_KEY']\n",
    "SORT_KEY = 'name'\n",
]


@pytest.mark.parametrize(("rule", "text", "secret"), POSITIVES)
def test_each_rule_redacts_the_value_and_keeps_the_line(rule: str, text: str, secret: str) -> None:
    redacted, counts = redact_secrets(text.encode())
    assert counts == {rule: 1}
    assert secret.encode() not in redacted
    assert f"<REDACTED:{rule}>".encode() in redacted
    assert redacted.replace(f"<REDACTED:{rule}>".encode(), secret.encode()) == text.encode()


@pytest.mark.parametrize("text", NEGATIVES)
def test_placeholders_and_code_are_left_alone(text: str) -> None:
    assert redact_secrets(text.encode()) == (text.encode(), {})


def test_every_rule_has_a_positive_case() -> None:
    covered = {rule for rule, _, _ in POSITIVES} | {c.rule for c in fake_credentials()}
    assert {rule.name for rule in RULES} == covered


FAKES = fake_credentials()


def test_the_fake_corpus_spans_enough_forms_and_providers() -> None:
    assert len(FAKES) >= 60
    assert len({c.provider for c in FAKES}) >= 15
    assert len({(c.text, c.secret) for c in FAKES}) == len(FAKES)  # every form its own
    assert all(c.secret in c.text and len(c.secret) >= 8 for c in FAKES)


@pytest.mark.parametrize("credential", FAKES, ids=lambda c: f"{c.provider}-{c.rule}-{c.syntax}")
def test_every_fake_credential_form_is_redacted(credential: FakeCredential) -> None:
    """Recall 100 % of the listed forms: the secret is gone, its expected rule fired, the syntax stays."""
    redacted, counts = redact_secrets(credential.text.encode())
    text = redacted.decode()
    assert credential.rule in counts, counts
    for piece in (credential.secret, *credential.parts):
        assert piece not in text
    before = (credential.text.split(credential.secret)[0].splitlines()[-1:] or [""])[0]
    assert before.split("-----BEGIN")[0] in text  # the line up to the value is kept


def test_the_prefilter_stays_within_the_fast_automaton() -> None:
    assert len(TRIGGER_RULES) <= MAX_FAST_TRIGGERS


def test_several_secrets_in_one_file() -> None:
    text = f"a = 1\nkey_id = {AWS_KEY_ID}\nsecret = '{AWS_SECRET}'\n{PRIVATE_KEY}tail\n"
    redacted, counts = redact_secrets(text.encode())
    assert counts == {"aws-access-key": 1, "secret-assignment": 1, "private-key": 1}
    assert redacted.startswith(b"a = 1\n") and redacted.endswith(b"-----END RSA PRIVATE KEY-----\ntail\n")


def test_planted_secrets_never_reach_the_corpus(
    make_tree: Callable[..., Path], build: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    files = {f"leak{i}.py": text for i, (_, text, _) in enumerate(POSITIVES)}
    files["clean.py"] = "print('nothing to see')\n"
    stats = build([dir_snapshot(make_tree(files))])
    out = tmp_path / "out"
    corpus = (out / "corpus.txt").read_text() + (out / "corpus.jsonl").read_text()
    for rule, _, secret in POSITIVES:
        assert secret not in corpus, rule
        assert secret.replace("\n", "\\n") not in corpus, rule  # as JSON escapes it
    assert stats["secrets_redacted"] == len(POSITIVES)
    expected: dict[str, int] = {}
    for rule, _, _ in POSITIVES:
        expected[rule] = expected.get(rule, 0) + 1
    assert stats["secrets_by_rule"] == dict(sorted(expected.items()))
    records = {r["path"]: r for r in read_jsonl(out / "corpus.jsonl")}
    assert records["clean.py"]["text"] == "print('nothing to see')\n"
    assert "<REDACTED:aws-access-key>" in records["leak0.py"]["text"]


def test_redaction_can_be_turned_off(
    make_tree: Callable[..., Path], build: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    stats = build([dir_snapshot(make_tree({"leak.py": POSITIVES[0][1]}))], redact_secrets=False)
    assert AWS_KEY_ID in (tmp_path / "out" / "corpus.txt").read_text()
    assert stats["secrets_redacted"] == 0


@pytest.mark.parametrize("native", ["1", "0"])
def test_fake_credentials_never_reach_the_corpus(
    make_tree: Callable[..., Path],
    build: Callable[..., dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    native: str,
) -> None:
    """A real build over every form, each in a file named as such files are, with and without C."""
    monkeypatch.setenv("MAT_CORPUS_NATIVE", native)
    files = {f"{c.provider.lower()}/{i:02d}/{c.filename}": c.text for i, c in enumerate(FAKES)}
    stats = build([dir_snapshot(make_tree(files))])
    assert stats["native"] is (native == "1")
    out = tmp_path / "out"
    corpus = (out / "corpus.txt").read_text() + (out / "corpus.jsonl").read_text()
    for credential in FAKES:
        for piece in (credential.secret, *credential.parts):
            assert piece not in corpus, credential
            assert json.dumps(piece)[1:-1] not in corpus, credential  # as JSON escapes it
    expected: dict[str, int] = {}
    for credential in FAKES:
        expected[credential.rule] = expected.get(credential.rule, 0) + 1
    assert stats["secrets_by_rule"] == dict(sorted(expected.items()))
    assert stats["files"] == len(FAKES)


STDLIB_REDACTION_BOUND = 40  # measured: 28 on CPython 3.11.7's 1,790 modules (31.5 MB), all test fixtures
NAME_RULES = {"secret-assignment", "netrc", "url-credentials", "authorization", "bearer-token"}


def test_redactions_in_the_standard_library_are_rare() -> None:
    """The stdlib holds no real credentials: only literal passwords in its tests' fixtures may be taken,
    and no provider format fires at all."""
    root = Path(sysconfig.get_paths()["stdlib"])
    counts: dict[str, int] = {}
    for path in root.rglob("*.py"):
        if not any(part.endswith("-packages") for part in path.relative_to(root).parts):
            for rule, count in redact_secrets(path.read_bytes())[1].items():
                counts[rule] = counts.get(rule, 0) + count
    assert sum(counts.values()) <= STDLIB_REDACTION_BOUND, counts
    assert set(counts) <= NAME_RULES, counts


def test_a_changed_rule_set_changes_the_corpus_fingerprint() -> None:
    """A corpus redacted by other rules is rebuilt rather than reused (builder.corpus_fingerprint)."""
    last = RULES[-1]
    assert ruleset_digest(RULES) == RULESET_DIGEST
    assert ruleset_digest(RULES[:-1]) != RULESET_DIGEST
    assert (
        ruleset_digest((*RULES[:-1], dataclasses.replace(last, triggers=last.triggers[:-1])))
        != RULESET_DIGEST
    )


HOSTILE_LINES = [b"password=", b"xoxb-", b"-----BEGIN PRIVATE KEY-----", b"ecret=", b"_auth=", b'token = "']


@pytest.mark.timeout(120)
@pytest.mark.parametrize("piece", HOSTILE_LINES)
def test_hostile_input_costs_linear_time(piece: bytes) -> None:
    """One megabyte-long line of a trigger over and over (a .md file may have such lines): every value
    and line look is bounded and hits inside a found secret are passed over, so this takes seconds;
    with unbounded values or line scans it took hours."""
    data = b"x " + piece * (1_000_000 // len(piece)) + b"\n"
    redacted, _ = redact_secrets(data)
    assert redacted.startswith(b"x ")
