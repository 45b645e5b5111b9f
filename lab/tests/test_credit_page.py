"""The credit page (lab/credit_page.py, ``lab/report.py RUN --credit-page HTML``): its numbers
are the step's, token for token; GRPO leaves every token white; the response span colours the
thinking and the tags; the README's EVISD_MIN_GAP edit shows as fewer coloured tokens; and the
page renders in a real headless browser, tooltip and all.

The runs here are the shared ``trained`` model (fitted to expert episodes of the ``world``
fixture) under a step's settings, played on that world's questions, so that its groups disagree
and the teacher has something to score. ``test_the_fast_loop_page`` (a CI step of its own) runs
the README's fast loop and its page for real."""
import html.parser
import os
import shutil
import time

import pytest
import torch

import evisd
import model
import runs
import train
from lab import credit as lab_credit
from lab import credit_page, report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP = dict(QUESTIONS_PER_STEP=4, GROUP_SIZE=4, MAX_TURNS=3, MAX_NEW_TOKENS=24)


class Page(html.parser.HTMLParser):
    """A credit page read back: ``columns`` (each header's text and coloured count) and
    ``episodes`` in the order drawn, each {"id", "a", "tokens": [(Â, δ, in m, coloured, text)],
    "blocks": [(label, text, how many generated tokens precede it)], "grey": text}."""

    def __init__(self, path):
        super().__init__()
        self.columns, self.episodes, self.stack = [], [], []
        self.feed(open(path, encoding="utf-8").read())

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("br", "meta"):        # no end tag follows these
            return
        self.stack.append((tag, a))
        if tag == "div" and a.get("class") == "col":
            self.columns.append({"text": ""})
        elif tag == "span" and a.get("class") == "count":
            self.columns[-1]["coloured"] = int(a["data-coloured"])
        elif tag == "div" and a.get("class") == "ep":
            self.episodes.append(dict(id=int(a["id"][1:]), a=float(a["data-a"]), tokens=[],
                                      blocks=[], grey=""))
        elif tag == "i" and "data-d" in a:
            hat, delta = map(float, a["data-d"].split())
            self.episodes[-1]["tokens"].append(
                [hat, delta, a.get("class") == "m", "style" in a, ""])
        elif tag == "span" and a.get("class") == "ctx" and any(   # not the legend's
                t == "div" and b.get("class") == "ep" for t, b in self.stack):
            self.episodes[-1]["blocks"].append(["", "", len(self.episodes[-1]["tokens"])])

    def handle_endtag(self, tag):
        self.stack.pop()

    def handle_data(self, data):
        tags = [(t, a.get("class")) for t, a in self.stack]
        if ("div", "col") in tags:
            self.columns[-1]["text"] += data
        elif ("div", "ep") not in tags:          # the title, the legend
            return
        elif ("span", "ctx") in tags:
            self.episodes[-1]["blocks"][-1][0 if tags[-1][0] == "b" else 1] += data
        elif tags and tags[-1][0] == "i":
            self.episodes[-1]["tokens"][-1][4] += data
        elif ("span", "g") in tags and ("details", None) not in tags:
            self.episodes[-1]["grey"] += data

    def column(self, k):
        """The episodes of column k, by episode index."""
        return {e["id"]: e for e in self.episodes[k::len(self.columns)]}


@pytest.fixture
def step_runs(trained, tok, world, monkeypatch):
    """Run directories that load as the trained model under a step's settings (METHOD as
    named: out/evisd, out/grpo), playing the fitted world's questions (the page's fixed group)."""
    cfg = dict(train.DEFAULTS, EVISD_MIN_GAP=0.0, **STEP)
    questions = [q for q in world.split("train") if q.hops == 1][:STEP["QUESTIONS_PER_STEP"]]
    monkeypatch.setattr(runs, "load_run", lambda run: (
        trained, tok, dict(cfg, METHOD=os.path.basename(run)), None))
    monkeypatch.setattr(lab_credit, "question_sets",
                        lambda cfg, n, validation=False: [(world, questions)])
    return cfg


def page(tmp_path, *argv):
    path = str(tmp_path / "credit.html")
    report.main([*argv, "--credit-page", path] if "--credit-page" not in argv else list(argv))
    return Page(path), path


def sampled_step(trained, tok, cfg):
    """The page's batch, sampled again, and evisd.credit's Â and m on it, computed here."""
    world, r, adv = credit_page.sample_step(trained, tok, cfg)
    with torch.no_grad():
        student = model.token_logprobs(trained, r.input_ids, r.attention_mask, r.gen_mask,
                                       temperature=cfg["TEMPERATURE"])
    token_adv, teacher, _ = evisd.credit(trained, tok, world, r, adv, student, cfg)
    return world, r, adv, token_adv, teacher - student, evisd.correction_mask(r, cfg)


def test_the_page_holds_the_steps_credit_token_for_token(step_runs, trained, tok, tmp_path):
    drawn, path = page(tmp_path, "out/evisd")
    world, r, adv, token_adv, delta, mask = sampled_step(trained, tok, step_runs)
    episodes = drawn.column(0)
    assert sorted(episodes) == list(range(len(adv))) == list(range(16))   # every episode, once
    assert (adv != 0).sum() >= 4 and ((token_adv != adv[:, None]) & r.gen_mask.bool()).any()
    for i, ep in episodes.items():
        gen = r.gen_mask[i].bool()
        assert ep["a"] == pytest.approx(float(adv[i]), abs=1e-8)
        hats = torch.tensor([t[0] for t in ep["tokens"]], dtype=torch.float32)
        assert torch.equal(hats, token_adv[i][gen])                   # Â, exactly
        assert [t[2] for t in ep["tokens"]] == mask[i][gen].tolist()  # m
        assert [t[1] for t in ep["tokens"]] == pytest.approx(delta[i][gen].tolist(), rel=1e-3,
                                                             abs=1e-3)
        assert [t[3] for t in ep["tokens"]] == (token_adv[i][gen] != adv[i]).tolist()
        assert "".join(t[4] for t in ep["tokens"]) == "".join(
            tok.decode([int(x)]) for x in r.input_ids[i][gen])
        # The blocks the teachers read: under the defaults, the evidence before each search
        # and the golden answer inside the answer, where A != 0; none where A = 0.
        evidence, answer = (tok.decode(b) for b in evisd.privileged_ids(tok, r.questions[i],
                                                                         world))
        searches, answers = evisd.scored_turns(r.spans[i], step_runs)
        want = ([("the search teacher reads", evidence)] * len(searches)
                + [("the answer teacher reads", answer)] * len(answers)) if adv[i] else []
        assert [tuple(b[:2]) for b in ep["blocks"]] == want
        # each where its teacher read it: before the search's opening tag, after <answer>'s
        at = [evisd.block_position(s, step_runs) for s in searches + answers] if adv[i] else []
        assert [int(gen.nonzero()[b[2]]) for b in ep["blocks"]] == at
        assert "<information>" in ep["grey"] or not searches     # the env's text is grey
    coloured = int(((token_adv != adv[:, None]) & r.gen_mask.bool()).sum())
    assert drawn.columns[0]["coloured"] == coloured > 0
    assert os.path.getsize(path) < 2e6


def test_grpo_leaves_every_token_white(step_runs, tmp_path):
    drawn, _ = page(tmp_path, "out/grpo")
    assert drawn.columns[0]["coloured"] == 0
    tokens = [t for ep in drawn.episodes for t in ep["tokens"]]
    assert tokens and not any(t[3] for t in tokens)                 # no background anywhere
    assert all(t[0] == pytest.approx(ep["a"], abs=1e-6) for ep in drawn.episodes
               for t in ep["tokens"])                                # Â = A on every token
    assert not any(ep["blocks"] for ep in drawn.episodes)           # no teacher read anything


def test_two_runs_side_by_side_score_the_same_episodes(step_runs, tmp_path):
    drawn, _ = page(tmp_path, "out/evisd", "out/grpo")
    evisd_col, grpo_col = drawn.column(0), drawn.column(1)
    assert len(drawn.columns) == 2 and sorted(evisd_col) == sorted(grpo_col)
    for i in evisd_col:
        assert [t[4] for t in evisd_col[i]["tokens"]] == [t[4] for t in grpo_col[i]["tokens"]]
        assert evisd_col[i]["a"] == grpo_col[i]["a"]
    assert drawn.columns[0]["coloured"] > 0 == drawn.columns[1]["coloured"]


def test_the_response_span_colours_thinking_and_tags(step_runs, trained, tok, tmp_path):
    drawn, _ = page(tmp_path, "out/evisd", "--credit-page", str(tmp_path / "credit.html"),
                    "--EVISD_SPAN=response")
    assert "--EVISD_SPAN=response" in drawn.columns[1]["text"]
    _, r, adv, _, _, _ = sampled_step(trained, tok, step_runs)
    outside = {}
    for k in (0, 1):
        outside[k] = 0
        for i, ep in drawn.column(k).items():
            content = set()
            for s in r.spans[i]:
                content |= set(range(s.content_start, s.content_end))
            positions = r.gen_mask[i].nonzero().squeeze(1).tolist()
            outside[k] += sum(t[3] for t, p in zip(ep["tokens"], positions) if p not in content)
    # EviSD's content span never colours a thinking or tag token; the whole response does.
    assert outside[0] == 0 and outside[1] > 0
    assert drawn.columns[1]["coloured"] > drawn.columns[0]["coloured"]


def test_the_readme_min_gap_edit_colours_fewer_tokens(step_runs, tmp_path, monkeypatch):
    """The README's first edit, applied: evisd.credit zeroes the gaps below EVISD_MIN_GAP. The
    page's second column (the edit at 0.5) colours fewer tokens of the same episodes, and only
    tokens the first column coloured."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "`EVISD_MIN_GAP = 0.0`" in readme and "zero the gaps below it" in readme
    original_credit, original_correction = evisd.credit, evisd.evisd_correction

    def credit(policy, tokenizer, world, rollouts, adv, student_logp, cfg):
        def correction(adv, gap, gen_mask, mask, lam, tau):
            gap = torch.where(gap.abs() < cfg["EVISD_MIN_GAP"], torch.zeros_like(gap), gap)
            return original_correction(adv, gap, gen_mask, mask, lam, tau)
        with monkeypatch.context() as m:
            m.setattr(evisd, "evisd_correction", correction)
            return original_credit(policy, tokenizer, world, rollouts, adv, student_logp, cfg)
    monkeypatch.setattr(evisd, "credit", credit)
    drawn, _ = page(tmp_path, "out/evisd", "--credit-page", str(tmp_path / "credit.html"),
                    "--EVISD_MIN_GAP=0.5")
    before, after = drawn.columns[0]["coloured"], drawn.columns[1]["coloured"]
    assert 0 < after < before
    for i, ep in drawn.column(1).items():
        for t, u in zip(ep["tokens"], drawn.column(0)[i]["tokens"]):
            assert not t[3] or u[3]                # the edit colours no token the default left
            assert not t[3] or abs(t[1]) >= 0.5     # and only where |δ| reaches the threshold


def test_bad_commands_stop_with_a_reason(step_runs, tmp_path):
    with pytest.raises(SystemExit, match="EVISD_SPAN='sideways'"):
        page(tmp_path, "out/evisd", "--credit-page", str(tmp_path / "x.html"),
             "--EVISD_SPAN=sideways")
    with pytest.raises(SystemExit, match="--resume and --overwrite are train.py's"):
        page(tmp_path, "out/evisd", "--credit-page", str(tmp_path / "x.html"), "--resume")
    with pytest.raises(SystemExit, match="one at a time"):
        page(tmp_path, "out/evisd", "--credit", "2")
    with pytest.raises(SystemExit):              # a setting without --credit-page: argparse's
        report.main(["out/evisd", "--EVISD_SPAN=response"])
    assert not os.path.exists(tmp_path / "x.html")


# ----------------------------------------------------------------------------- in a browser
def browser():
    """A headless Debian chromium driven by selenium, or a skip saying what is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test drives "
                                    "chromium with selenium: pip install selenium")
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and driver):
        pytest.skip("the browser test needs Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver; .ci/run installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1500,1100"):
        options.add_argument(flag)
    from selenium.webdriver.chrome.service import Service
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def check_in_browser(path, png, episodes):
    """Load the page in chromium: every episode drawn, and the tooltip of a scored token shows
    its δ and Â; then a screenshot with that tooltip open, written to ``png``."""
    drawn = Page(path)
    driver = browser()                          # or a skip, before selenium is imported
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    try:
        driver.get("file://" + os.path.abspath(path))
        shown = driver.find_elements(By.CSS_SELECTOR, ".ep")
        assert len(shown) == episodes * len(drawn.columns)
        assert all(e.size["height"] > 0 for e in shown)              # each one laid out
        # the token the teacher moved most in the first column: hover, read its tooltip
        ep, j = max(((ep, j) for ep in drawn.column(0).values()
                     for j, t in enumerate(ep["tokens"]) if t[2]),
                    key=lambda pair: abs(pair[0]["tokens"][pair[1]][0] - pair[0]["a"]))
        token = driver.find_elements(By.CSS_SELECTOR, f"#e{ep['id']} i")[j]
        assert driver.find_element(By.ID, "tip").get_attribute("hidden") is not None
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", token)
        ActionChains(driver).move_to_element(token).perform()
        tip = driver.find_element(By.ID, "tip")
        hat, delta = token.get_attribute("data-d").split()
        assert tip.is_displayed()
        assert f"Â     {hat}" in tip.text and f"δ     {delta}" in tip.text
        assert "m     yes" in tip.text and float(hat) == ep["tokens"][j][0]
        driver.save_screenshot(png)
    finally:
        driver.quit()
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_page_renders_in_a_browser(step_runs, tmp_path):
    _, path = page(tmp_path, "out/evisd", "--credit-page", str(tmp_path / "credit.html"),
                   "--EVISD_SPAN=response")
    check_in_browser(path, str(tmp_path / "credit.png"), episodes=16)


@pytest.mark.ci_step
def test_the_fast_loop_page(tmp_path, monkeypatch):
    """The README's fast loop, then its last command, for real (a warm-up of 2 minutes): the
    page is written in 15 s or less and weighs 2 MB or less, its Â are evisd.credit's on the
    same batch, and it renders in a browser, alone and beside the whole-response row (whose
    screenshot is lab/results/credit-page.png: CREDIT_PAGE_PNG=path keeps it)."""
    monkeypatch.chdir(tmp_path)                # the README's paths, under tmp_path
    out = "out/fast"
    train.main(["--RL_STEPS=5", "--EVAL_EVERY=0", "--MEASURE=True", f"--OUT_DIR={out}",
                "--overwrite"])
    path = os.path.join(out, "credit.html")
    t0 = time.perf_counter()
    report.main([out, "--credit-page", path])
    seconds = time.perf_counter() - t0
    assert seconds <= 15 and os.path.getsize(path) <= 2e6, (seconds, os.path.getsize(path))
    lm, tok, cfg, _ = runs.load_run(out)
    _, r, adv, token_adv, _, _ = sampled_step(lm, tok, cfg)
    episodes = Page(path).column(0)
    assert len(episodes) == cfg["QUESTIONS_PER_STEP"] * cfg["GROUP_SIZE"] == len(adv)
    for i, ep in episodes.items():
        hats = torch.tensor([t[0] for t in ep["tokens"]], dtype=torch.float32)
        assert torch.equal(hats, token_adv[i][r.gen_mask[i].bool()])
    check_in_browser(path, str(tmp_path / "credit.png"), episodes=len(adv))
    # Beside the whole-response row: the picture of lab/results/credit-page.png
    report.main([out, "--credit-page", path, "--EVISD_SPAN=response"])
    png = os.path.join(ROOT, os.environ.get("CREDIT_PAGE_PNG") or str(tmp_path / "response.png"))
    check_in_browser(path, png, episodes=len(adv))


def test_the_readme_episode_is_the_committed_pages():
    """The README's worked episode is episode #50 of lab/results/credit-page.html, the page of
    the README's fast loop on seed 0 (its three commands regenerate it): the question, A, and the
    answer token's δ and Â as the README writes them; the query left as it was (Â = A)."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    text = readme[readme.index("## One episode and its teacher"):readme.index("## Reading")]
    drawn = Page(os.path.join(ROOT, "lab/results/credit-page.html"))
    ep = drawn.column(0)[50]
    number = lambda v, digits: f"{v:.{digits}f}".replace("-", "−")
    assert "Episode #50 of that page" in text
    assert "*in which country is nasgor press based?*" in text
    assert f"A = {number(ep['a'], 2)}" in text
    ven = next(t for t in ep["tokens"] if t[2] and t[4] == " ven")    # the answer's, in m
    assert f"(δ = {number(ven[1], 1)})" in text and f"Â = {number(ven[0], 2)} = A − λ|A|" in text
    assert ven[0] == pytest.approx(ep["a"] - 0.2 * abs(ep["a"]), rel=1e-4)
    query = [t for t in ep["tokens"] if t[2]][:2]           # " nas", "gor": the query, in m
    assert "".join(t[4] for t in query) == " nasgor"
    assert all(number(t[0], 2) == number(ep["a"], 2) for t in query)      # "Â stays −1.21"
    assert [b[0] for b in ep["blocks"]] == ["the search teacher reads",
                                             "the answer teacher reads"]
    assert "ventam: is a city in barrosia." in ep["blocks"][0][1]
    assert "the answer is barrosia." in ep["blocks"][1][1]
