"""Headless Chromium driven by selenium (Debian ``chromium`` and ``chromium-driver``, which
``make test`` installs as root; the tests that need them are skipped otherwise)."""

from __future__ import annotations

import shutil

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def chromium(width: int = 1280, height: int = 900) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",  # (as root, in a container)
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or "chromium"
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or "chromedriver"))
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    return driver
