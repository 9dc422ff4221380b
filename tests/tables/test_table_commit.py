"""The tables layer on a real LanceDB table, no server (docs/ARCHITECTURE.md, "Backfills"): the plan's
chunks stay inside fragments as offset ranges (deleted rows left out), a slice of a vector column
arrives as the data plane's tensor column, and a fragment commit writes only its rows (skipped rows
null, sidecar null), keeps row ids, survives an append that got in first, and is redone unchanged."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

pytestmark = pytest.mark.unit

lancedb = pytest.importorskip("lancedb")


def test_plan_slice_and_commit(tmp_path):
    from lancefn_jupyter.tables.commit import ChunkPart, commit_fragment
    from lancefn_jupyter.tables.plan import open_table, plan_rows
    from lancefn_jupyter.tables.slices import read_slice, slice_offsets
    from lancefn_jupyter.wire import dataplane
    from lancefn_jupyter.wire.backfill_models import TableSlice

    db = lancedb.connect(str(tmp_path))
    vectors = pa.array([[float(i), 1.0] for i in range(20)], pa.list_(pa.float32(), 2))
    table = db.create_table("t", pa.table({"id": list(range(20)), "vec": vectors}))
    table.add(pa.table({"id": [20, 21], "vec": pa.array([[20.0, 1.0], [21.0, 1.0]], pa.list_(pa.float32(), 2))}))
    table.delete("id = 3")

    plan = plan_rows(
        open_table(table.uri), into="norm", version="v1", recompute="missing", where="id != 7", chunk_size=8
    )
    assert plan.fragments == {0: 18, 1: 2}
    assert [c["ranges"] for c in plan.chunks] == [[[0, 3], [4, 7], [8, 10]], [[10, 18]], [[18, 20]], [[0, 2]]]

    first = TableSlice(uri=table.uri, table_version=plan.table_version, **plan.chunks[0], columns={"v": "vec"})
    rows = read_slice(first, {"v": "tensor<float32>"})
    values = dataplane.decode_rows(rows)
    assert [row["v"].tolist() for row in values] == [[float(i), 1.0] for i in (0, 1, 2, 4, 5, 6, 8, 9)]

    # Fragment 0's results: the norm of each vector, with row offset 5 skipped (a null result, its error kept apart).
    parts = []
    for chunk in plan.chunks[:3]:  # fragment 0's chunks; windows of 4 rows cut across them
        offsets = slice_offsets(chunk["ranges"])
        column = dataplane.encode_results([None if o == 5 else float(o) for o in offsets], "float64", many=True)
        errors = pa.array(['{"message": "bad row"}' if o == 5 else None for o in offsets], pa.utf8())
        parts.append(ChunkPart(offsets, lambda column=column, errors=errors: (column.column(0), errors)))
    appended = pa.table({"id": [22], "vec": pa.array([[22.0, 1.0]], pa.list_(pa.float32(), 2))})
    table.add(appended)  # a writer got in first
    args = {"into": "norm", "output_type": "float64", "parts": parts, "version": "v1", "window": 4}
    commit_fragment(table.uri, 0, **args)
    commit_fragment(table.uri, 0, **args)  # redone after a restart: the same table

    table = db.open_table("t")
    data = table.to_arrow().sort_by("id").to_pydict()
    expected = {i: (None if i in (5, 7) else float(i)) for i in range(20) if i != 3}
    assert dict(zip(data["id"][:19], data["norm"][:19], strict=True)) == expected
    assert data["norm"][19:] == [None, None, None]  # fragment 1 and the appended row: not committed
    assert data["norm__lancefn_version"][:4] == ["v1", "v1", "v1", "v1"] and data["norm__lancefn_version"][4] is None
    assert table.count_rows() == 22
    assert table.search().where("norm IS NULL").limit(None).to_arrow().num_rows == 5
    again = plan_rows(open_table(table.uri), into="norm", version="v1", recompute="missing", where=None, chunk_size=8)
    assert again.rows_total == 5  # the skipped row, the filtered one, fragment 1's two and the appended one


@pytest.mark.parametrize(
    ("output_type", "values", "arrow_type"),
    [
        ("list<float64>", lambda i: [float(i)] * (i % 3), "list<item: double>"),
        ("utf8", lambda i: f"row {i}", "string"),
        ("tensor<float32>", lambda i: np.full(3, i, dtype=np.float32), "fixed_size_list<item: float>[3]"),
    ],
)
def test_a_column_of_each_kind_committed_twice(tmp_path, output_type, values, arrow_type):
    from lancefn_jupyter.tables.commit import ChunkPart, commit_fragment
    from lancefn_jupyter.wire import dataplane

    db = lancedb.connect(str(tmp_path))
    table = db.create_table("t", pa.table({"id": list(range(6))}))
    for scale in (1, 10):  # the second commit replaces the first one's data file
        offsets = np.arange(6)
        column = dataplane.encode_results([values(i * scale) for i in range(6)], output_type, many=True).column(0)
        part = ChunkPart(offsets, lambda column=column: (column, None))
        commit_fragment(table.uri, 0, into="out", output_type=output_type, parts=[part], version=f"v{scale}")
    table = db.open_table("t")
    assert str(table.schema.field("out").type) == arrow_type
    got = table.to_arrow().sort_by("id").column("out").to_pylist()
    expected = [values(i * 10) for i in range(6)]
    assert got == [e.tolist() if isinstance(e, np.ndarray) else e for e in expected]
    assert table.to_arrow().column("out__lancefn_version").to_pylist() == ["v10"] * 6


def test_backfills_into_other_columns_of_one_table_at_once_all_commit(tmp_path):
    """Each commit adds its column first (a commit of its own): when another backfill's got in between, it is redone
    on the newer table, as a lost Merge commit is (before, the column's add failed the backfill: CommitConflictError)."""
    import threading

    from lancefn_jupyter.tables.commit import ChunkPart, commit_fragment

    db = lancedb.connect(str(tmp_path))
    table = db.create_table("t", pa.table({"id": list(range(50))}))
    names = [f"out{i}" for i in range(6)]
    start, errors = threading.Barrier(len(names)), []

    def backfill(into: str, scale: float) -> None:
        offsets = np.arange(50)
        part = ChunkPart(offsets, lambda: (pa.array(offsets * scale, pa.float64()), None))
        start.wait()
        try:
            commit_fragment(table.uri, 0, into=into, output_type="float64", parts=[part], version="v1")
        except Exception as error:  # the test's own failure, named below
            errors.append(f"{into}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=backfill, args=(into, i + 1.0)) for i, into in enumerate(names)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    data = db.open_table("t").to_arrow().sort_by("id")
    for i, into in enumerate(names):
        assert data.column(into).to_pylist() == [float(row * (i + 1)) for row in range(50)], into
