"""The status page in a real browser: headless Chromium driven by Selenium (tests/browser.rs).

Loads the page from a proxy's metrics listener, waits (explicitly: for what the page's script
draws, never for a time) until it shows what the test set up, and checks it: each master's
state and its colour, a lock's key shown as text (never as markup), a quarantine counting
down, and that no forbidden string (a lock's token, a password) is anywhere in the page.

Exits 0 when every check holds; otherwise an AssertionError or a TimeoutException with what
the page showed.
"""

import argparse
import os
import re
import sys

# Selenium Manager, which would download a browser or a driver, is never wanted: both come
# from Debian's packages.
os.environ["SE_OFFLINE"] = "true"

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

# How long the page may take to show what is expected: it redraws every 2 s, and a paused
# master is marked down within a probe or two.
WAIT_S = 30

# The state colours (background of each state's badge), as the page's stylesheet sets them.
COLOURS = {
    "up": "rgb(218, 251, 225)",
    "down": "rgb(254, 228, 226)",
    "quarantined": "rgb(255, 244, 214)",
}


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=options, service=service)


# What the page shows, read in one go inside the page: its script redraws every couple of
# seconds, and elements found one by one could be replaced between two reads.
SNAPSHOT = """
const text = (e) => (e ? e.textContent : "");
return {
  loaded: document.body.dataset.loaded === "1",
  masters: [...document.querySelectorAll("#masters tbody tr.master")].map((row) => {
    const badge = row.querySelector("td.state-cell .badge");
    return {
      name: row.querySelector("td.name").firstChild.textContent,
      state: text(badge),
      rowState: row.dataset.state,
      colour: badge ? getComputedStyle(badge).backgroundColor : "",
      left: text(row.querySelector("td.quarantine")),
    };
  }),
  keys: [...document.querySelectorAll("#locks tbody tr.lock")].map((row) => {
    const cell = row.querySelector("td.key");
    return { key: cell.textContent, elements: cell.children.length, row: row.innerText };
  }),
  bold: document.querySelectorAll("#locks b").length,
  updated: text(document.getElementById("updated")),
};
"""


def snapshot(driver):
    return driver.execute_script(SNAPSHOT)


def masters(driver):
    """Each master as the page shows it: name -> state."""
    return {m["name"]: m["state"] for m in snapshot(driver)["masters"]}


def quarantine_left(driver, name):
    return next(m["left"] for m in snapshot(driver)["masters"] if m["name"] == name)


def seconds(text):
    """'59 s', '1 min 05 s' -> seconds."""
    total = 0
    for number, unit in re.findall(r"(\d+)\s*(d|h|min|s)\b", text):
        total += int(number) * {"d": 86400, "h": 3600, "min": 60, "s": 1}[unit]
    return total


def page_text(driver):
    """Everything in the document: visible text, text in collapsed parts, and the markup."""
    return driver.execute_script("return document.documentElement.textContent") + driver.page_source


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--down", action="append", default=[])
    parser.add_argument("--up", action="append", default=[])
    parser.add_argument("--quarantined", action="append", default=[])
    parser.add_argument("--key", required=True, help="a held lock's key the page must list")
    parser.add_argument("--forbid", action="append", default=[], help="text that must not be on the page")
    parser.add_argument("--screenshot")
    args = parser.parse_args()
    expected = {**{n: "up" for n in args.up}, **{n: "down" for n in args.down},
                **{n: "quarantined" for n in args.quarantined}}

    driver = browser()
    try:
        driver.get(args.url)
        wait = WebDriverWait(driver, WAIT_S, poll_frequency=0.1)
        try:
            wait.until(lambda d: snapshot(d)["loaded"])
            wait.until(lambda d: masters(d) == expected)
            wait.until(lambda d: any(k["key"] == args.key for k in snapshot(d)["keys"]))
        except TimeoutException:
            print("the page never showed", expected, "and the key", repr(args.key), file=sys.stderr)
            print("it showed:", snapshot(driver), file=sys.stderr)
            print(driver.find_element(By.TAG_NAME, "body").text, file=sys.stderr)
            raise
        shown = snapshot(driver)

        # State colours: a glance tells up from down from quarantined.
        for m in shown["masters"]:
            assert m["state"] == m["rowState"], m
            assert m["colour"] == COLOURS[m["state"]], f"the badge of a master {m['state']} is {m['colour']}"

        # The key is text: markup in it is shown as it is, not interpreted.
        lock = next(k for k in shown["keys"] if k["key"] == args.key)
        assert lock["elements"] == 0 and shown["bold"] == 0, f"markup in a key was interpreted: {shown}"
        assert "held by client" in lock["row"], lock

        # The page refreshes itself: a later view replaces this one, without a reload.
        updated = snapshot(driver)["updated"]
        wait.until(lambda d: snapshot(d)["updated"] != updated)

        # A quarantine counts down between views.
        for name in args.quarantined:
            first = quarantine_left(driver, name)
            assert seconds(first) > 0, f"no time left shown for {name}: {first!r}"
            wait.until(lambda d: 0 < seconds(quarantine_left(d, name)) < seconds(first))
            print(f"{name}: quarantine left {first} -> {quarantine_left(driver, name)}")

        text = page_text(driver)
        for forbidden in args.forbid:
            assert forbidden not in text, f"{forbidden!r} is on the page"
        assert "Configuration in force" in text and "requirepass" in text, "the configuration is shown"

        if args.screenshot:
            driver.save_screenshot(args.screenshot)
            print("screenshot:", args.screenshot)
        print("masters shown:", masters(driver))
        print("status page checks passed")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
