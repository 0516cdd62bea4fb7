-- A session's CSRF token is no longer stored: it is derived from the cookie's secret, and the
-- store keeps its hash (`csrf_hash`), as it does for session ids and token secrets. The clear
-- tokens of existing sessions are dropped with those sessions: everyone signs in again once.
DELETE FROM sessions;
ALTER TABLE sessions RENAME COLUMN csrf_token TO csrf_hash;
