//! `trainyard user ...`: managing accounts from the server's machine, straight on its database
//! (the way in before any administrator can sign in, and the way back when every one is locked
//! out). Each change is written to the audit log with the actor `cli`.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::access::audit::AuditAction;
use crate::access::{password, secret};
use crate::store::{self, now_ms, DynStore};

/// The database is found as `serve` finds it: the same flags, environment variables and
/// defaults (a test compares the two), so the command reaches the server's own database.
#[derive(Debug, Args)]
pub struct UserArgs {
    /// The server's data directory (its default SQLite database lives there), as `serve`'s.
    #[arg(
        long,
        env = "TRAINYARD_DATA_DIR",
        default_value = "./trainyard-data",
        global = true
    )]
    pub data_dir: PathBuf,
    /// `sqlite:PATH` or `postgres://...` when the server's database is not the SQLite file in
    /// --data-dir, as `serve`'s.
    #[arg(long, env = "DATABASE_URL", global = true)]
    pub database_url: Option<String>,
    /// Create the database when there is none yet (the first command on a new server);
    /// without it a missing database is an error, never a new empty one.
    #[arg(long, global = true)]
    pub create_database: bool,
    #[command(subcommand)]
    pub command: UserCommand,
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user; without --password-stdin a random password is printed once.
    Add {
        name: String,
        /// An instance administrator (sees and does everything).
        #[arg(long)]
        admin: bool,
        /// Read the password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
    },
    /// List the users.
    List,
    /// Disable a user: they cannot sign in, and their sessions and tokens stop working.
    Disable { name: String },
    /// Enable a disabled user again.
    Enable { name: String },
    /// Set a new password (ends the user's sessions); without --password-stdin a random one is
    /// printed once.
    ResetPassword {
        name: String,
        #[arg(long)]
        password_stdin: bool,
    },
}

pub async fn run(args: UserArgs) -> anyhow::Result<()> {
    let store = open(&args).await?;
    match args.command {
        UserCommand::Add {
            name,
            admin,
            password_stdin,
        } => {
            let (text, generated) = new_password(password_stdin)?;
            let hash = hash(text.clone()).await?;
            let user = store
                .create_user(&name, Some(&hash), admin)
                .await
                .map_err(plain)?;
            audit(
                &store,
                AuditAction::UserAdd,
                &user.name,
                admin.then(|| "admin".into()),
            )
            .await;
            println!(
                "added {}{}",
                user.name,
                if admin { " (administrator)" } else { "" }
            );
            if generated {
                println!("password: {text}");
            }
        }
        UserCommand::List => {
            for u in store.list_users().await? {
                let mut notes = Vec::new();
                if u.is_admin {
                    notes.push("administrator");
                }
                if u.disabled {
                    notes.push("disabled");
                }
                if !u.has_password {
                    notes.push("no password");
                }
                println!("{}\t{}", u.name, notes.join(", "));
            }
        }
        UserCommand::Disable { name } => set_disabled(&store, &name, true).await?,
        UserCommand::Enable { name } => set_disabled(&store, &name, false).await?,
        UserCommand::ResetPassword {
            name,
            password_stdin,
        } => {
            let user = find(&store, &name).await?;
            let (text, generated) = new_password(password_stdin)?;
            let hash = hash(text.clone()).await?;
            store.set_password(&user.id, &hash, now_ms()).await?;
            audit(&store, AuditAction::UserPassword, &user.name, None).await;
            println!(
                "password of {} changed; their sessions have ended",
                user.name
            );
            if generated {
                println!("password: {text}");
            }
        }
    }
    Ok(())
}

async fn open(args: &UserArgs) -> anyhow::Result<DynStore> {
    // What `serve` opens.
    let url = crate::settings::database_url(&args.data_dir, args.database_url.as_deref());
    if args.create_database {
        let store = store::connect(&url)
            .await
            .map_err(|e| anyhow::anyhow!("creating the database {}: {e}", shown(&url)))?;
        eprintln!("using the Trainyard database {}", shown(&url));
        return Ok(store);
    }
    existing_database(&url).await?;
    store::connect(&url)
        .await
        .map_err(|e| anyhow::anyhow!("opening the database {}: {e}", shown(&url)))
}

/// Fails unless `url` names a database that holds Trainyard's tables, without creating or
/// changing anything: a command run outside the server's directory, or with the wrong
/// `DATABASE_URL`, must not make a new empty database that the server never reads.
async fn existing_database(url: &str) -> anyhow::Result<()> {
    use sqlx::{ConnectOptions, Connection};
    let hint = "Run it with the server's --data-dir or --database-url (TRAINYARD_DATA_DIR, \
                DATABASE_URL), or pass --create-database to start a new one";
    let found = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(|e| anyhow::anyhow!("cannot open the database {}: {e}", shown(url)))?;
        let tables: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name IN ($1, $2, $3)",
        )
        .bind(TRAINYARD_TABLES[0])
        .bind(TRAINYARD_TABLES[1])
        .bind(TRAINYARD_TABLES[2])
        .fetch_one(&mut conn)
        .await?;
        let _ = conn.close().await;
        tables == 3
    } else if url.starts_with("sqlite:") {
        let options = std::str::FromStr::from_str(url)
            .map(|o: sqlx::sqlite::SqliteConnectOptions| o.read_only(true).create_if_missing(false))
            .map_err(|e| anyhow::anyhow!("bad SQLite URL {}: {e}", shown(url)))?;
        let path = options.get_filename().to_path_buf();
        if url.contains(":memory:") || url.contains("mode=memory") {
            bail!(
                "an in-memory database holds no server's accounts: {}",
                shown(url)
            );
        }
        if !path.is_file() {
            bail!("no Trainyard database at {}. {hint}.", path.display());
        }
        let mut conn = options
            .connect()
            .await
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
        let tables: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?)",
        )
        .bind(TRAINYARD_TABLES[0])
        .bind(TRAINYARD_TABLES[1])
        .bind(TRAINYARD_TABLES[2])
        .fetch_one(&mut conn)
        .await
        .map_err(|e| anyhow::anyhow!("{} is not a SQLite database: {e}", path.display()))?;
        let _ = conn.close().await;
        if tables != 3 {
            bail!("{} is not a Trainyard database. {hint}.", path.display());
        }
        true
    } else {
        bail!(
            "unsupported database URL {}: expected sqlite:PATH or postgres://...",
            shown(url)
        );
    };
    if !found {
        bail!(
            "no Trainyard tables in the database {}. {hint}.",
            shown(url)
        );
    }
    Ok(())
}

/// Tables every Trainyard database has, from its first migration on.
const TRAINYARD_TABLES: [&str; 3] = ["_sqlx_migrations", "experiments", "runs"];

/// A database URL as it may be printed: without its password.
fn shown(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        // Not a URL the parser takes: leave out everything up to the host.
        Err(_) => match url.rsplit_once('@') {
            Some((head, host)) => {
                let scheme = head.split_once("://").map_or("", |(s, _)| s);
                format!("{scheme}://…@{host}")
            }
            None => url.to_owned(),
        },
    }
}

async fn find(store: &DynStore, name: &str) -> anyhow::Result<crate::store::accounts::User> {
    match store.user_by_name(name).await? {
        Some(user) => Ok(user),
        None => bail!("no user named `{name}`"),
    }
}

async fn set_disabled(store: &DynStore, name: &str, disabled: bool) -> anyhow::Result<()> {
    let user = find(store, name).await?;
    store.set_user_disabled(&user.id, disabled).await?;
    let action = if disabled {
        AuditAction::UserDisable
    } else {
        AuditAction::UserEnable
    };
    audit(store, action, &user.name, None).await;
    println!(
        "{} {}",
        if disabled { "disabled" } else { "enabled" },
        user.name
    );
    Ok(())
}

/// The password to set: the first line of stdin, or a generated one (then `true`).
fn new_password(from_stdin: bool) -> anyhow::Result<(String, bool)> {
    if !from_stdin {
        // 24 hex characters of a fresh secret: 96 random bits.
        let generated = secret::new_secret();
        let text = generated
            .get(secret::PREFIX.len()..secret::PREFIX.len() + 24)
            .unwrap_or(&generated)
            .to_owned();
        return Ok((text, true));
    }
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    let text = line.trim_end_matches(['\n', '\r']).to_owned();
    if let Err(reason) = password::check_strength(&text) {
        bail!("{reason}");
    }
    Ok((text, false))
}

async fn hash(text: String) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || password::hash_password(&text))
        .await?
        .map_err(|e| anyhow::anyhow!("hashing the password: {e}"))
}

async fn audit(store: &DynStore, action: AuditAction, target: &str, detail: Option<String>) {
    let entry = crate::store::accounts::AuditNew {
        time: now_ms(),
        actor: Some("cli".into()),
        client: None,
        action: action.as_str().into(),
        target: Some(target.into()),
        detail,
    };
    if let Err(e) = store.append_audit(entry).await {
        eprintln!("warning: could not write the audit log: {e}");
    }
}

/// A store refusal in plain words ("user `bob` already exists").
fn plain(e: crate::store::StoreError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn user_finds_the_database_with_the_same_flags_variables_and_defaults_as_serve() {
        let cli = crate::cli::Cli::command();
        let sub = |name: &str| {
            cli.find_subcommand(name)
                .unwrap_or_else(|| panic!("subcommand {name}"))
                .clone()
        };
        let (serve, user) = (sub("serve"), sub("user"));
        for id in ["data_dir", "database_url"] {
            let arg = |c: &clap::Command| {
                let a = c
                    .get_arguments()
                    .find(|a| a.get_id() == id)
                    .unwrap_or_else(|| panic!("{id} of {}", c.get_name()))
                    .clone();
                (
                    a.get_long().map(str::to_owned),
                    a.get_env().map(|e| e.to_os_string()),
                    a.get_default_values().to_vec(),
                )
            };
            assert_eq!(arg(&serve), arg(&user), "{id}");
        }
    }

    #[test]
    fn a_database_url_is_shown_without_its_password() {
        let text = shown("postgres://ty:s3cret-pw@db.lan:5432/trainyard");
        assert!(!text.contains("s3cret-pw"), "{text}");
        assert!(text.contains("ty@db.lan:5432/trainyard"), "{text}");
        assert_eq!(
            shown("sqlite:///srv/ty/trainyard.db"),
            "sqlite:///srv/ty/trainyard.db"
        );
        assert!(!shown("postgres://ty:p%w@x y/db").contains("p%w"));
    }
}
