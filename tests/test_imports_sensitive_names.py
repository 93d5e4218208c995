"""What resolved names mean to the import check (quasar/imports/sensitive_names.py): importers,
loaders, code runners, the import system's state and the harmless corners of the machinery."""

from __future__ import annotations

import pytest

from quasar.imports.sensitive_names import Kind, kind_of

KINDS: dict[Kind | None, tuple[str, ...]] = {
    Kind.MODULE: ("fla.ops", "importlib.machinery"),
    Kind.STATE: ("sys.modules", "<globals>", "builtins.__dict__"),
    Kind.CODE: ("builtins.exec", "ctypes.pythonapi.PyRun_SimpleString", "code.InteractiveInterpreter"),
    Kind.MODULE_IMPORTER: ("importlib.import_module", "builtins.__import__"),
    Kind.PATH_LOADER: ("runpy.run_path", "importlib.machinery.SourceFileLoader"),
    Kind.GETATTR: ("operator.attrgetter", "builtins.getattr"),
    # Reading sys.modules or sys.path is fine; anything else done to them changes the imports.
    Kind.IMPORT_STATE: ("sys.modules.pop", "sys.path.insert", "sys.meta_path.append", "site.addsitedir"),
    Kind.MACHINERY: (
        "importlib.machinery.PathFinder.find_spec",
        "pkgutil.walk_packages",
        "zipimport.zipimporter",
        "importlib.metadata_evil",  # the harmless list below is matched by whole dotted parts
    ),
    None: (
        "sys.modules.get",
        "sys.path.index",
        "importlib.metadata.version",
        "pkgutil.iter_modules",
        "codecs.decode",  # prefixes are whole names: codecs is not code, impish is not imp
        "impish.run",
        "torch.compile",
        "re.compile",
    ),
}


@pytest.mark.parametrize(("dotted", "kind"), [(dotted, kind) for kind, names in KINDS.items() for dotted in names])
def test_kind_of(dotted, kind):
    assert kind_of(dotted) is kind
