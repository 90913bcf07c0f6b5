"""docs/architecture.md, the map of the code, stays true: every file,
folder, link and Bazel target it names exists, and no source cites a
document the project does not have.
"""

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"
TOP_FOLDERS = {p.name for p in ROOT.iterdir()
               if p.is_dir() and not p.name.startswith((".", "bazel-"))}
SOURCE_FOLDERS = ("base", "bazel", "bench", "capture", "client", "deploy", "examples", "gallery",
                  "proto", "runtime", "server", "tests", "tools")
SOURCE_SUFFIXES = {".py", ".cc", ".h", ".sh", ".bzl", ".bazel", ".proto", ".yaml", ".json"}


def declares(package: str, name: str) -> bool:
    """Whether package's BUILD.bazel declares a target (or macro) `name`."""
    build = ROOT / package / "BUILD.bazel"
    return build.exists() and f'name = "{name}"' in build.read_text()


def problems_of(text: str, base: pathlib.Path):
    """What `text` (Markdown read from `base`) names that does not exist."""
    problems = []
    for link in re.findall(r"\]\(([^)#\s]+)", text):
        if not link.startswith(("http://", "https://")) and not (base / link).resolve().exists():
            problems.append(f"link {link}")
    for token in re.findall(r"`([^`\s]+)`", text):
        if token.startswith("//"):
            package, _, name = token[2:].partition(":")
            if package.endswith("/..."):
                exists = (ROOT / package[:-4]).is_dir()
            else:
                exists = (ROOT / package / "BUILD.bazel").exists() and (not name or declares(package, name))
            if not exists:
                problems.append(f"Bazel target {token}")
        elif "/" in token and token.split("/")[0] in TOP_FOLDERS and not re.search(r"[*<>{}$]", token):
            path = token.split(":")[0].rstrip(".,")
            # A build output is named by the target that makes it.
            if not (ROOT / path).exists() and not declares(str(pathlib.Path(path).parent),
                                                           pathlib.Path(path).name):
                problems.append(f"path {token}")
    return problems


def test_everything_the_map_names_exists():
    problems = problems_of(MAP.read_text(), MAP.parent)
    assert not problems, "docs/architecture.md names what does not exist:\n" + "\n".join(problems)


def test_the_check_catches_a_name_that_went_away():
    for stale in ("[x](../runtime/model.cc)", "`//runtime:model`", "`runtime/model.h`",
                  "`//nonexistent/...`"):
        assert problems_of(stale, MAP.parent), stale
    for fine in ("[x](../runtime/loaded_version.h)", "`//runtime:loaded_version`",
                 "`runtime/loaded_version.h`", "`runtime/libprecompile_python.so`", "`//server/...`"):
        assert not problems_of(fine, MAP.parent), fine


DOCUMENTS = {p.name for p in ROOT.rglob("*.md")
             if not any(part.startswith((".", "bazel-")) for part in p.relative_to(ROOT).parts)}


def missing_documents(text: str):
    """The Markdown documents `text` cites that the project does not have."""
    return [cited for cited in re.findall(r"\b([\w./-]*[A-Za-z]\.md)\b", text)
            if pathlib.Path(cited).name not in DOCUMENTS]


def project_files(folder: str):
    """The project's files under `folder`: what git tracks or would (not what
    it ignores, such as tests/device/gpu_bundle's third-party Python)."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", folder],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
        return [ROOT / name for name in listed]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        return list((ROOT / folder).rglob("*"))


def test_no_source_cites_a_document_the_project_lacks():
    assert missing_documents("see NOWHERE.md section 1") == ["NOWHERE.md"]
    assert missing_documents("see docs/architecture.md and bench/RESULTS.md") == []
    problems = []
    for folder in SOURCE_FOLDERS:
        for source in project_files(folder):
            # This file quotes what it catches.
            if source.suffix in SOURCE_SUFFIXES and source.is_file() and source != pathlib.Path(__file__).resolve():
                for cited in missing_documents(source.read_text(errors="replace")):
                    problems.append(f"{source.relative_to(ROOT)} cites {cited}")
    assert not problems, "\n".join(problems)


# The package table: | [pkg/](../pkg/) | what | may depend on |
PACKAGE_ROW = re.compile(r"^\| (\[[^|]*\]\([^|]*\)(?:, \[[^|]*\]\([^|]*\))*) \| .* \| (.*) \|$", re.M)
RULE = re.compile(r"^(\w+)\(\n(.*?)^\)", re.M | re.S)


def split_top_level(column: str):
    """`a (`x`, `y`), b, c` -> ['a (`x`, `y`)', 'b', 'c']."""
    items, depth, current = [], 0, ""
    for c in column:
        depth += c == "("
        depth -= c == ")"
        if c in ",:" and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += c
    return [i for i in items + [current.strip()] if i]


def allowed_dependencies(column: str):
    """{package: set of target names, or None for any} of the project's
    packages a row's "may depend on" column names."""
    allowed = {}
    for item in split_top_level(column):
        m = re.fullmatch(r"(\w+)(?: \((.*)\))?", item)
        if m and m[1] in TOP_FOLDERS:
            targets = re.findall(r"`(\w+)`", m[2] or "")
            allowed[m[1]] = set(targets) or None
    return allowed


def library_dependencies(package: str):
    """(package, target) of every project dependency of the non-test rules
    of `package` and its subpackages (a test may reach further, e.g. the
    test server)."""
    found = set()
    rules = [rule for build in sorted((ROOT / package).rglob("BUILD.bazel"))
             for rule in RULE.findall(build.read_text())]
    for kind, body in rules:
        # A package_group lists who may see, not what is used.
        if kind.endswith("_test") or kind == "package_group" or re.search(r'name = "\w*_test"', body):
            continue
        for dep_package, target in re.findall(r'"//([\w/]+)(?::(\w+))?"', body):
            top = dep_package.split("/")[0]
            if (target or "").startswith("__"):
                continue  # A visibility, not a dependency.
            if top != package and top in TOP_FOLDERS:
                found.add((top, target or dep_package.split("/")[-1]))
    return found


def dependency_problems(text: str):
    problems = []
    for packages, column in PACKAGE_ROW.findall(text):
        allowed = allowed_dependencies(column)
        for package in re.findall(r"\[(\w+)/\]", packages):
            for dep_package, names in allowed.items():
                for name in names or ():
                    if not declares(dep_package, name):
                        problems.append(f"{package} may depend on {dep_package}'s `{name}`, "
                                        "which does not exist")
            if "anything" in column:
                continue
            for dep_package, target in sorted(library_dependencies(package)):
                if dep_package not in allowed:
                    problems.append(f"{package} depends on //{dep_package}:{target}; the map does "
                                    f"not let it depend on {dep_package}")
                elif allowed[dep_package] is not None and target not in allowed[dep_package]:
                    problems.append(f"{package} depends on //{dep_package}:{target}, not among "
                                    f"the {dep_package} targets the map lists")
    return problems


SERVER_ROW = re.compile(r"^\| \[server/(\w+)/\]\(\.\./server/\w+/\) \| .* \| (.*) \|$", re.M)


def server_package_problems(text: str):
    """Where a server package depends on another that its row's "uses"
    column does not name (or a row names a package that does not exist)."""
    problems = []
    rows = dict(SERVER_ROW.findall(text))
    packages = {b.parent.name for b in (ROOT / "server").glob("*/BUILD.bazel")}
    for package in sorted(packages - rows.keys()):
        problems.append(f"server/{package} has no row in the server's table")
    for package, uses in rows.items():
        if package not in packages:
            problems.append(f"server/{package} is in the table but not in the tree")
            continue
        build = (ROOT / "server" / package / "BUILD.bazel").read_text()
        for kind, body in RULE.findall(build):
            if kind.endswith("_test"):
                continue
            # Who may use a target is not what it uses.
            body = re.sub(r"visibility\s*=\s*\[[^\]]*\]", "", body)
            for used in re.findall(r'"//server/(\w+)[:"]', body):
                if used != package and not re.search(rf"\b{used}\b", uses):
                    problems.append(f"server/{package} uses server/{used}; its row does not say so")
    return sorted(set(problems))


def test_the_server_table_names_each_package_and_what_it_uses():
    assert not server_package_problems(MAP.read_text())
    # An arrow the table does not show, and a package it lacks, are caught.
    table = MAP.read_text().replace("| api, scheduling |", "| scheduling |")
    assert "server/http uses server/api; its row does not say so" in server_package_problems(table)
    table = re.sub(r"^\| \[server/metrics/\].*$", "", MAP.read_text(), flags=re.M)
    assert "server/metrics has no row in the server's table" in server_package_problems(table)


def test_the_package_table_names_real_targets_and_every_dependency():
    problems = dependency_problems(MAP.read_text())
    assert not problems, "docs/architecture.md's package table:\n" + "\n".join(problems)


def test_the_dependency_check_catches_a_stale_name_and_an_unlisted_arrow():
    row = "| [server/](../server/) | what | runtime (`model`, `value`), proto |\n"
    problems = dependency_problems(row)
    assert any("`model`, which does not exist" in p for p in problems), problems
    assert any("not among the runtime targets" in p for p in problems), problems
    assert any("does not let it depend on base" in p for p in problems), problems
