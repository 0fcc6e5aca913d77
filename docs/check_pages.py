"""Opens the built manual in a headless browser (Debian's Chromium, driven by
Selenium through Debian's chromedriver) and checks what a reader would see:
each page below shows its title, and its pictures loaded (every <img> done
and non-empty, and at least as many as the page must show). Saves a
screenshot of the front page beside the HTML. Gives up after two minutes.

  python docs/check_pages.py build/docs/html      (scripts/docs.sh runs it)
"""
import pathlib
import signal
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

# page: (its title, the fewest pictures it shows)
PAGES = {
    "index.html": ("Conveyor", 1),
    "guides/python.html": ("Train an nn.Module from Python", 0),
    "guides/schedules.html": ("Choose and read a schedule", 14),
    "guides/planning.html": ("Plan and tune", 1),
    "reference/options.html": ("Every option", 0),
}


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(60)
    return driver


def check(driver, html):
    failures = []
    for page, (title, pictures) in PAGES.items():
        driver.get((html / page).as_uri())
        heading = driver.find_element(By.TAG_NAME, "h1").text.strip().rstrip("#¶ ").strip()
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0])")
        broken = [src for src, ok in images if not ok]
        print(f"check_pages.py: {page}: '{heading}', {len(images)} pictures, {len(broken)} not shown")
        if heading != title:
            failures.append(f"{page}: the title is '{heading}', not '{title}'")
        if broken:
            failures.append(f"{page}: pictures that did not load: {broken}")
        if len(images) < pictures:
            failures.append(f"{page}: {len(images)} pictures, fewer than {pictures}")
        if page == "index.html":
            driver.save_screenshot(str(html.parent / "front_page.png"))
    return failures


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    html = pathlib.Path(sys.argv[1]).resolve()
    signal.signal(signal.SIGALRM, lambda *_: sys.exit("check_pages.py: the browser took over two minutes"))
    signal.alarm(120)
    driver = browser()
    try:
        failures = check(driver, html)
    finally:
        driver.quit()
    if failures:
        sys.exit("check_pages.py: " + "\n  ".join(["the built manual fails:"] + failures))
    print(f"check_pages.py: {len(PAGES)} pages checked; the front page: {html.parent / 'front_page.png'}")


if __name__ == "__main__":
    main()
