"""Each redaction rule, the placeholders it leaves alone, and planted secrets never reaching the corpus."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from multiagenttrainer.corpus.secrets import MAX_FAST_TRIGGERS, RULES, TRIGGER_RULES, redact_secrets
from tests.corpus.conftest import dir_snapshot, read_jsonl

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
    assert {rule.name for rule in RULES} == {rule for rule, _, _ in POSITIVES}


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
