"""Which tables a namespace's backfills may open (docs/ARCHITECTURE.md, "Backfills", "Which tables"): the pure
rule, including symlinks out of a root and object-store prefixes."""

from __future__ import annotations

import os

import pytest

from lancefn_jupyter.server.policy.table_roots import TableRoots, parse_table_roots


def test_a_single_namespace_server_without_roots_backfills_any_table():
    assert TableRoots().problem("/anywhere/t.lance", "default", admin=False) is None


def test_a_shared_server_without_roots_backfills_none_but_the_admins(tmp_path):
    roots = TableRoots(shared=True)
    problem = roots.problem(str(tmp_path / "t.lance"), "vision", admin=False)
    assert problem is not None and "--table-roots '/data/{namespace}'" in problem
    assert roots.problem(str(tmp_path / "t.lance"), None, admin=True) is None


def test_each_namespace_stays_under_its_own_root_and_symlinks_do_not_lead_out(tmp_path):
    (tmp_path / "vision").mkdir()
    (tmp_path / "nlp" / "db").mkdir(parents=True)
    os.symlink(tmp_path / "nlp" / "db", tmp_path / "vision" / "escape")
    roots = TableRoots((str(tmp_path / "{namespace}"),), shared=True)
    assert roots.problem(str(tmp_path / "vision" / "db" / "t.lance"), "vision", admin=False) is None
    outside = roots.problem(str(tmp_path / "nlp" / "db" / "t.lance"), "vision", admin=False)
    assert outside is not None and str(tmp_path / "vision") in outside and "'vision'" in outside
    assert roots.problem(str(tmp_path / "vision" / "escape" / "t.lance"), "vision", admin=False) is not None
    assert roots.problem(str(tmp_path / "vision-other" / "t.lance"), "vision", admin=False) is not None  # a prefix
    assert roots.problem(str(tmp_path / "vision" / ".." / "nlp" / "t.lance"), "vision", admin=False) is not None


def test_object_store_prefixes():
    roots = TableRoots(("s3://bucket/teams/{namespace}",), shared=True)
    assert roots.problem("s3://bucket/teams/nlp/t.lance", "nlp", admin=False) is None
    assert roots.problem("s3://bucket/teams/nlp-x/t.lance", "nlp", admin=False) is not None
    assert roots.problem("/bucket/teams/nlp/t.lance", "nlp", admin=False) is not None


def test_bad_roots_are_refused_saying_why():
    assert parse_table_roots(" /data/{namespace} , s3://b/p ") == ("/data/{namespace}", "s3://b/p")
    assert parse_table_roots(None) == ()
    with pytest.raises(ValueError, match="not an absolute path"):
        parse_table_roots("data/{namespace}")
    with pytest.raises(ValueError, match="only placeholder"):
        parse_table_roots("/data/{team}")
