"""API keys (plunder.access) as the store keeps them, and the sessions bound to them."""

from __future__ import annotations

from collections.abc import Sequence

from plunder import access, errors, payload
from plunder.access import ApiKey, Role
from plunder.store import convert
from plunder.store.driver import Now, Row, Tx
from plunder.store.engine import Engine

MAX_KEY_NAME = 200


class Keys:
    """Create, read and revoke API keys; a revoke ends the key's live sessions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def key_create(
        self,
        *,
        role: str,
        group: str = access.DEFAULT_GROUP,
        queues: Sequence[str] = (),
        name: str = "",
        expires_in: float | None = None,
        now: Now = None,
    ) -> tuple[ApiKey, str]:
        """A new key, and its secret (shown once: only its hash is kept)."""
        checked_role = access.check_role(role)
        access.check_group(group)
        names = [payload.check_queue(q) for q in dict.fromkeys(queues)]
        if expires_in is not None:
            convert.positive("a key's lifetime", expires_in)
        key_id, secret, hashed = access.new_secret()

        def op(tx: Tx) -> Row | None:
            if group != access.DEFAULT_GROUP and names:
                self._take_queues(tx, group, names)
            return tx.one(
                "key_insert",
                key_id=key_id,
                name=str(name)[:MAX_KEY_NAME],
                role=checked_role.value,
                key_group=group,
                queues=self.engine.list_in(names),
                secret_hash=hashed,
                expires_in=None if expires_in is None else float(expires_in),
                now=tx.clock(now),
            )

        row = self.engine.run(op)
        assert row is not None
        return self._key(row), secret

    def _take_queues(self, tx: Tx, group: str, names: list[str]) -> None:
        """The queues become ``group``'s; refused (the transaction undone) if another
        group has one of them."""
        tx.all("queue_group_take", group_name=group, queues=self.engine.list_in(names))
        owners = {r["queue"]: r["group_name"] for r in tx.all("queue_group_list")}
        taken = sorted(q for q in names if owners.get(q) != group)
        if taken:
            raise errors.ConfigError(
                f"the queue(s) {', '.join(taken)} belong to another group already"
            )

    def queue_groups(self) -> dict[str, str]:
        """The queues of groups other than the default one, with their group."""
        rows = self.engine.run(lambda tx: tx.all("queue_group_list"), write=False)
        return {r["queue"]: r["group_name"] for r in rows}

    def key_get(self, key_id: str) -> ApiKey | None:
        access.check_key_id(key_id)
        row = self.engine.run(lambda tx: tx.one("key_get", key_id=key_id), write=False)
        return None if row is None else self._key(row)

    def key_list(self) -> list[ApiKey]:
        rows = self.engine.run(lambda tx: tx.all("key_list"), write=False)
        return [self._key(row) for row in rows]

    def key_revoke(self, key_id: str, *, now: Now = None) -> tuple[ApiKey, list[str]]:
        """Revoke a key (again: no change) and end the live sessions it opened; the key and
        the ids of those sessions."""
        access.check_key_id(key_id)

        def op(tx: Tx) -> tuple[Row | None, list[str]]:
            clock = tx.clock(now)
            row = tx.one("key_revoke", key_id=key_id, now=clock)
            if row is None:
                return None, []
            ended = tx.all("session_end_for_key", key_id=key_id, now=clock)
            return row, [r["id"] for r in ended]

        row, sessions = self.engine.run(op)
        if row is None:
            raise errors.ConfigError(f"no key {key_id}")
        return self._key(row), sessions

    def _key(self, row: Row) -> ApiKey:
        engine = self.engine
        return ApiKey(
            id=row["id"],
            name=row["name"],
            role=Role(row["role"]),
            group=row["key_group"],
            queues=tuple(engine.list_out(row["queues"])),
            created_at=engine.time(row["created_at"]),
            expires_at=engine.opt_time(row["expires_at"]),
            revoked_at=engine.opt_time(row["revoked_at"]),
            secret_hash=row["secret_hash"],
        )
