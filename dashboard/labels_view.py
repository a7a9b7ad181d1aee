"""Tags and a note on a job or a sweep: shown as text, with a form to edit them.

The note is a person's Markdown source and is shown as the text it is (`plain`): no link,
image or HTML comes out of it. A refused change keeps the form open with each problem under
its field; the saved values are put back in the fields as stored (trimmed, each tag once)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import streamlit as st

from dashboard import actions
from dashboard.format import plain
from db.spec import Labels, SpecError


@dataclass(frozen=True)
class LabelsOwner:
    """What the labels belong to: `kind` ("job" or "sweep") names the widgets' keys."""

    kind: str
    owner_id: int
    save: Callable[[Mapping[str, Any]], Labels]  # raises SpecError, or LookupError if gone
    gone: str  # the message when it no longer exists
    saved: str  # the message when the change is saved
    edit_label: str = "Edit tags and note"

    def key(self, field: str) -> str:
        return f"{self.kind}.{field}.{self.owner_id}"

    @property
    def problems_key(self) -> str:
        return f"{self.kind}.label_problems"


def labels_part(owner: LabelsOwner, labels: Labels) -> None:
    if labels.tags:
        st.caption("Tags: " + plain(", ".join(labels.tags)))
    if labels.note:
        with st.container(border=True):
            st.markdown(plain(labels.note))
    st.session_state.setdefault(owner.key("tags"), ", ".join(labels.tags))
    st.session_state.setdefault(owner.key("note"), labels.note)
    problems = st.session_state.get(owner.problems_key, {}).get(owner.owner_id, {})
    with (
        st.expander(owner.edit_label, expanded=bool(problems)),
        st.form(f"{owner.kind}.labels.{owner.owner_id}"),
    ):
        st.text_input("Tags", help="Separated by commas.", key=owner.key("tags"))
        if "tags" in problems:
            st.error(plain(problems["tags"]), icon=":material/error:")
        st.text_area("Note", help="Markdown source; shown as text.", key=owner.key("note"))
        if "note" in problems:
            st.error(plain(problems["note"]), icon=":material/error:")
        st.form_submit_button("Save tags and note", on_click=save_labels, args=(owner,))


def save_labels(owner: LabelsOwner) -> None:
    changes = {field: st.session_state.get(owner.key(field), "") for field in ("tags", "note")}
    st.session_state[owner.problems_key] = {}
    try:
        labels = owner.save(changes)
    except SpecError as exc:
        st.session_state[owner.problems_key] = {owner.owner_id: exc.problems}
        return
    except LookupError:
        actions.flash("error", owner.gone)
        return
    st.session_state[owner.key("tags")] = ", ".join(labels.tags)
    st.session_state[owner.key("note")] = labels.note
    actions.flash("success", owner.saved)
