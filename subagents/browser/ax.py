"""Roles, accessible names and states of snapshot elements, from Chromium's AX tree.

:data:`~subagents.browser.dom.SNAPSHOT_JS` leaves the elements it listed in a
non-enumerable ``window.__fleetRefs`` array. Through a CDP session we take that
array's object ids and ask ``Accessibility.getPartialAXTree`` for each element's own
node (no relatives), so role, name, value, checked and disabled are what Chromium
computes for assistive technology (accname, implicit roles, ``aria-*``,
``<label>``, ``alt``, ``aria-hidden``), not a re-implementation of those rules.

The requests go out together (CDP pipelines them) and cost a few tens of
milliseconds for 80 elements even on a 35,000-node page. An element the tree marks
as ignored (``aria-hidden``, ``role=presentation`` on a focusable-less node) is left
out of the list, as a screen reader would leave it out. An element whose node cannot
be read (the page navigated in between, the object was collected) keeps the
script's own role and name: the list stays usable and the click still resolves.
"""

from __future__ import annotations

import asyncio
from typing import Any

from playwright.async_api import CDPSession
from playwright.async_api import Error as PlaywrightError

_GROUP = "fleet-snapshot"
_NAME_CHARS = 120


async def ax_nodes(cdp: CDPSession, count: int) -> list[dict[str, Any] | None]:
    """The AX node of each of the first ``count`` listed elements (None if unreadable)."""
    if count == 0:
        return []
    try:
        found = await cdp.send(
            "Runtime.evaluate", {"expression": "window.__fleetRefs", "objectGroup": _GROUP}
        )
        array = found.get("result", {}).get("objectId")
        if not array:
            return [None] * count
        props = await cdp.send("Runtime.getProperties", {"objectId": array, "ownProperties": True})
        ids: dict[int, str] = {}
        for prop in props.get("result", []):
            oid = prop.get("value", {}).get("objectId")
            if prop.get("name", "").isdigit() and oid:
                ids[int(prop["name"])] = oid
        return list(await asyncio.gather(*(_node(cdp, ids.get(i)) for i in range(count))))
    finally:
        try:
            await cdp.send("Runtime.releaseObjectGroup", {"objectGroup": _GROUP})
        except PlaywrightError:
            pass  # the page went away: its objects went with it


async def _node(cdp: CDPSession, object_id: str | None) -> dict[str, Any] | None:
    if object_id is None:
        return None
    try:
        tree = await cdp.send(
            "Accessibility.getPartialAXTree", {"objectId": object_id, "fetchRelatives": False}
        )
    except PlaywrightError:
        return None
    nodes = tree.get("nodes") or []
    return nodes[0] if nodes else None


def _props(node: dict[str, Any]) -> dict[str, Any]:
    return {p["name"]: p.get("value", {}).get("value") for p in node.get("properties", [])}


def merge(elements: list[dict[str, Any]], nodes: list[dict[str, Any] | None]) -> list[dict]:
    """``elements`` (from the script) with role, name and states from their AX nodes."""
    out = []
    for item, node in zip(elements, nodes, strict=False):
        if node is None:
            out.append(item)
            continue
        if node.get("ignored"):
            continue
        merged = dict(item)
        role = str(node.get("role", {}).get("value") or "")
        if role:
            merged["role"] = role
        name = " ".join(str(node.get("name", {}).get("value") or "").split())
        if name:
            merged["name"] = name[:_NAME_CHARS]
        props = _props(node)
        value = node.get("value", {}).get("value")
        if value not in (None, "") and role not in ("button", "link", "checkbox", "radio"):
            merged["value"] = str(value)[:80]
        if "checked" in props:
            merged["checked"] = props["checked"] in ("true", "mixed", True)
        if props.get("disabled") is True:
            merged["disabled"] = True
        out.append(merged)
    out.extend(elements[len(nodes) :])
    return out
