//! `trainyard user ...`: managing accounts from the server's machine, straight on its database
//! (the way in before any administrator can sign in, and the way back when every one is locked
//! out). Each change is written to the audit log with the actor `cli`.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::access::{password, secret};
use crate::store::{self, now_ms, DynStore};

#[derive(Debug, Args)]
pub struct UserArgs {
    /// The server's data directory (its default SQLite database lives there).
    #[arg(
        long,
        env = "TRAINYARD_DATA_DIR",
        default_value = "./trainyard-data",
        global = true
    )]
    pub data_dir: PathBuf,
    /// The server's database, when it is not the SQLite file in --data-dir.
    #[arg(long, env = "DATABASE_URL", global = true)]
    pub database_url: Option<String>,
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
                "user_add",
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
            audit(&store, "user_password", &user.name, None).await;
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
    let url = match args.database_url.as_deref().filter(|u| !u.is_empty()) {
        Some(url) => url.to_owned(),
        None => {
            std::fs::create_dir_all(&args.data_dir)
                .with_context(|| format!("creating data directory {}", args.data_dir.display()))?;
            format!(
                "sqlite://{}?mode=rwc",
                args.data_dir.join("trainyard.db").display()
            )
        }
    };
    store::connect(&url)
        .await
        .map_err(|e| anyhow::anyhow!("opening the database: {e}"))
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
        "user_disable"
    } else {
        "user_enable"
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

async fn audit(store: &DynStore, action: &str, target: &str, detail: Option<String>) {
    let entry = crate::store::accounts::AuditNew {
        time: now_ms(),
        actor: Some("cli".into()),
        client: None,
        action: action.into(),
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
