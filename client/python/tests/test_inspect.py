"""`dsprep inspect --plot` writes an SVG that a real XML parser reads, of the stated size."""

import subprocess
import xml.etree.ElementTree as ET

from conftest import dsprep_bin

SVG = "{http://www.w3.org/2000/svg}"


def test_the_plot_is_a_well_formed_svg_of_the_stated_size(packed_dir, tmp_path):
    out = tmp_path / "mix.svg"
    done = subprocess.run(
        [str(dsprep_bin()), "inspect", str(packed_dir), "--plot", str(out), "--every", "100000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    root = ET.parse(out).getroot()
    assert root.tag == f"{SVG}svg"
    assert (root.attrib["width"], root.attrib["height"], root.attrib["viewBox"]) == ("960", "720", "0 0 960 720")
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 2 * 5
    # 2,077,650 tokens every 100,000: 21 points per line.
    assert all(len(line.attrib["points"].split()) == 21 for line in lines)
    names = {t.text for t in root.findall(f"{SVG}text")}
    assert {"fineweb-edu", "c4", "zyda-2", "the-stack-v2", "finemath"} <= names
