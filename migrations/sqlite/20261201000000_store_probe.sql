-- Written and emptied again by the store's health check after a failed write: a committed write
-- of about a batch's size, which fails while the database has no room for it.
CREATE TABLE store_probe (
    id   INTEGER PRIMARY KEY,
    data BLOB NOT NULL
);
