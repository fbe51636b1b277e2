"""A whole-page screenshot of a report, as a reader's browser draws it: Debian's chromium, headless,
a tall window 1280 px wide (WIDTH), the blank bottom cropped.  python bench/screenshot.py PAGE.html OUT.png [WIDTH]"""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

page, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
width = int(sys.argv[3]) if len(sys.argv) > 3 else 1280   # a laptop's window
with tempfile.TemporaryDirectory() as tmp:
    shot = Path(tmp) / "shot.png"
    subprocess.run([shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--hide-scrollbars",
                    f"--window-size={width},12000", f"--screenshot={shot}", f"file://{page}"],
                   check=True, capture_output=True)
    im = Image.open(shot).convert("RGB")
    inked_rows = np.nonzero((np.asarray(im).min(axis=2) < 250).any(axis=1))[0]
    # A palette of 256 colours keeps charts and text sharp at a fraction of the size.
    im.crop((0, 0, width, int(inked_rows[-1]) + 40)).quantize(256).save(out, optimize=True)
print(f"{out}: {Image.open(out).size}")
