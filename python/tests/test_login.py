"""`caw_box.auth.login`: the vendor's login in the box, its URL and code handed to the caller
(`on_prompt`) instead of the terminal. codex's real device-code flow runs against a stub of
this test standing in for auth.openai.com (its network alias, HTTPS with a certificate of a
CA made here; tests/e2e/login.rs has the vendor facts), on the rig's internal network; so does
claude's paste-code flow, the stub standing in for platform.claude.com and api.anthropic.com
(tests/e2e/login_claude.rs), the code going back as `on_prompt`'s return value; and gemini's
Google login in its UI, the stub standing in for oauth2.googleapis.com and www.googleapis.com
(tests/e2e/login_gemini.rs)."""

import base64
import json
import subprocess
import time
import uuid

import caw_box
from conftest import TEST_LABEL, STUB_IMAGE, TEST_KEY, docker


def _tls(tmp_path, hosts=("auth.openai.com",)):
    """A CA, and a certificate for `hosts` signed by it: (ca.pem path, cert, key)."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=caw-box test CA",
            "-keyout", "ca.key", "-out", "ca.pem")
    names = ",".join(f"DNS:{h}" for h in hosts)
    (tmp_path / "ext").write_text(f"subjectAltName={names}\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={hosts[0]}", "-keyout", "leaf.key",
            "-out", "leaf.csr")
    openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "ext", "-out", "leaf.pem")
    return tmp_path / "ca.pem", (tmp_path / "leaf.pem").read_text(), (tmp_path / "leaf.key").read_text()


def _auth_stub(rig, tmp_path, name):
    """A stub on the rig's network that is also auth.openai.com (HTTPS on 443, a certificate
    of a CA made here), holding a ChatGPT login: (its name, the CA file, the refresh token)."""
    ca, cert, key = _tls(tmp_path)
    refresh = f"rt_py{uuid.uuid4().hex}"
    # A ChatGPT login's access token: a JWT whose claims codex reads (never verifies).
    b64 = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")
    claims = {"exp": int(time.time()) + 3600, "email": "dev@example.com",
              "https://api.openai.com/auth": {"chatgpt_account_id": "acct-py", "chatgpt_plan_type": "pro"}}
    access = f"{b64({'alg': 'RS256', 'typ': 'JWT'})}.{b64(claims)}.pyaccesssig{uuid.uuid4().hex}"
    stub = f"{name}-{rig.run_id}"
    docker("run", "-d", "--name", stub, "--label", f"{TEST_LABEL}={rig.run_id}", "--network", rig.network,
           "--network-alias", "auth.openai.com", "--sysctl", "net.ipv4.ip_unprivileged_port_start=0",
           "-e", f"STUB_OAUTH={access},{refresh}", "-e", f"STUB_TLS_CERT={cert}", "-e", f"STUB_TLS_KEY={key}",
           STUB_IMAGE)
    return stub, ca, refresh


def _logins_left(rig):
    return docker("ps", "-aq", "--filter", "label=io.caw-box.role=login", "--filter",
                  f"label={TEST_LABEL}={rig.run_id}")


def test_login_gives_the_url_and_code_to_the_caller_and_stores_the_login(rig, tmp_path, monkeypatch):
    monkeypatch.setenv("CAW_BOX_DATA_DIR", str(tmp_path / "data"))
    stub, ca, refresh = _auth_stub(rig, tmp_path, "auth")
    try:
        _approved_login(rig, tmp_path, stub, ca, refresh)
    finally:
        # Another test's stub takes the alias next.
        docker("rm", "-f", stub, check=False)


def _approved_login(rig, tmp_path, stub, ca, refresh):
    prompts = []

    def approve(prompt):
        prompts.append(prompt)
        fetch = ("fetch('http://127.0.0.1:8080/_stub/device/approve?code=' + process.argv[1], {method: 'POST'})"
                 ".then(async r => console.log(await r.text()))")
        docker("exec", stub, "node", "-e", fetch, prompt["code"])

    items = caw_box.auth.login("codex", on_prompt=approve, network=rig.network, ca_cert=str(ca), timeout="2m")
    assert [p["url"] for p in prompts] == ["https://auth.openai.com/codex/device"], prompts
    assert prompts[0]["provider"] == "codex" and prompts[0]["code"], prompts
    assert [(i["target"], i["source"]) for i in items] == [(".codex/auth.json", "login")], items
    stored = json.loads((tmp_path / "data/auth/codex/home/.codex/auth.json").read_text())
    assert stored["tokens"]["refresh_token"] == refresh
    assert refresh not in json.dumps(items)
    assert _logins_left(rig) == ""


def test_an_exception_of_on_prompt_ends_the_login_with_nothing_stored_or_left(rig, tmp_path, monkeypatch):
    monkeypatch.setenv("CAW_BOX_DATA_DIR", str(tmp_path / "data"))
    stub, ca, _ = _auth_stub(rig, tmp_path, "auth-raise")

    def refuse(prompt):
        raise ValueError(f"not now: {prompt['code']}")

    try:
        caw_box.auth.login("codex", on_prompt=refuse, network=rig.network, ca_cert=str(ca), timeout="2m")
        raise AssertionError("login returned")
    except ValueError as e:
        assert str(e).startswith("not now: "), e
    finally:
        docker("rm", "-f", stub, check=False)
    assert _logins_left(rig) == ""
    assert not (tmp_path / "data/auth/codex").exists()


def test_login_with_an_api_key_stores_it_without_a_container(rig, tmp_path, monkeypatch):
    monkeypatch.setenv("CAW_BOX_DATA_DIR", str(tmp_path))
    items = caw_box.auth.login("gemini", api_key=TEST_KEY)
    assert [(i["kind"], i["target"], i["source"]) for i in items] == [("env", "GEMINI_API_KEY", "login")]
    assert TEST_KEY not in json.dumps(items)
    status = {row["provider"]: row for row in caw_box.auth.status()}
    assert status["gemini"]["present"]


def _paste_code_login(rig, tmp_path, provider, hosts, page, access, refresh):
    """`caw_box.auth.login(provider)` with a paste-code flow, the stub on the rig's network
    standing in for the vendor's `hosts` and approving at its `page`: (the prompts
    `on_prompt` got, the items stored). Nothing of the login is left on Docker."""
    ca, cert, key = _tls(tmp_path, hosts)
    stub = f"{provider}-auth-{rig.run_id}"
    aliases = [arg for h in hosts for arg in ("--network-alias", h)]
    docker("run", "-d", "--name", stub, "--label", f"{TEST_LABEL}={rig.run_id}", "--network", rig.network,
           *aliases, "--sysctl", "net.ipv4.ip_unprivileged_port_start=0",
           "-e", f"STUB_OAUTH={access},{refresh}", "-e", f"STUB_TLS_CERT={cert}", "-e", f"STUB_TLS_KEY={key}",
           STUB_IMAGE)
    prompts = []

    def approve(prompt):
        prompts.append(prompt)
        fetch = (f"fetch('http://127.0.0.1:8080/_stub/{page}/approve?url=' + encodeURIComponent(process.argv[1]),"
                 " {method: 'POST'}).then(async r => console.log(await r.text()))")
        return json.loads(docker("exec", stub, "node", "-e", fetch, prompt["url"]))["code"]

    try:
        items = caw_box.auth.login(provider, on_prompt=approve, network=rig.network, ca_cert=str(ca), timeout="2m")
    finally:
        docker("rm", "-f", stub, check=False)
    assert len(prompts) == 1 and prompts[0]["needs"] == "code" and "code" not in prompts[0], prompts
    assert refresh not in json.dumps(items) and access not in json.dumps(items)
    assert _logins_left(rig) == ""
    return prompts, items


def test_claudes_paste_code_login_takes_the_code_on_prompt_returns(rig, tmp_path, monkeypatch):
    """claude's paste-code flow (`claude auth login`; tests/e2e/login_claude.rs has the vendor
    facts): `on_prompt` gets the URL with `needs: "code"` and returns the code the page
    shows after approval, which caw-box pastes into the CLI."""
    monkeypatch.setenv("CAW_BOX_DATA_DIR", str(tmp_path / "data"))
    access, refresh = f"sk-ant-oat01-py{uuid.uuid4().hex}", f"sk-ant-ort01-py{uuid.uuid4().hex}"
    prompts, items = _paste_code_login(rig, tmp_path, "claude", ("platform.claude.com", "api.anthropic.com"),
                                       "claude", access, refresh)
    assert prompts[0]["url"].startswith("https://claude.ai/oauth/authorize?"), prompts
    assert [(i["target"], i["source"]) for i in items] == [(".claude/.credentials.json", "login")], items
    stored = json.loads((tmp_path / "data/auth/claude_code/home/.claude/.credentials.json").read_text())
    assert stored["claudeAiOauth"]["refreshToken"] == refresh


def test_geminis_google_login_in_its_ui_takes_the_code_on_prompt_returns(rig, tmp_path, monkeypatch):
    """gemini's Google login, which runs only on a terminal (tests/e2e/login_gemini.rs has the
    vendor facts): the same `needs: "code"` prompt as claude's; the bare code it returns
    goes to gemini's UI, and both of gemini's login files are stored."""
    monkeypatch.setenv("CAW_BOX_DATA_DIR", str(tmp_path / "data"))
    access, refresh = f"ya29.py{uuid.uuid4().hex}", f"1//py{uuid.uuid4().hex}"
    prompts, items = _paste_code_login(rig, tmp_path, "gemini", ("oauth2.googleapis.com", "www.googleapis.com"),
                                       "google", access, refresh)
    assert prompts[0]["provider"] == "gemini", prompts
    assert prompts[0]["url"].startswith("https://accounts.google.com/o/oauth2/v2/auth?"), prompts
    assert [(i["target"], i["source"]) for i in items] == [
        (".gemini/oauth_creds.json", "login"), (".gemini/google_accounts.json", "login")], items
    home = tmp_path / "data/auth/gemini/home/.gemini"
    assert json.loads((home / "oauth_creds.json").read_text())["refresh_token"] == refresh
    assert json.loads((home / "google_accounts.json").read_text())["active"] == "stub@example.invalid"
