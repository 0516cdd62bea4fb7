//! What every page shows about the caller (the signed-in user, the admin links) and the CSRF
//! token its forms carry. The access check sets it for the duration of each page request, so
//! templates read it without every view struct carrying it: `{{ crate::http::pages::chrome::csrf() }}`.

use crate::access::Principal;

#[derive(Debug, Clone, Default)]
pub struct Chrome {
    /// Whether the server has accounts (sign-in, sign-out and the account page are shown).
    pub accounts: bool,
    /// The signed-in user's name.
    pub user: Option<String>,
    pub admin: bool,
    /// The session's CSRF token, echoed by every form (empty without a session).
    pub csrf: String,
}

tokio::task_local! {
    static CHROME: Chrome;
}

impl Chrome {
    pub fn of(principal: &Principal, accounts: bool) -> Chrome {
        Chrome {
            accounts,
            user: principal.user().map(|u| u.name.clone()),
            admin: accounts && principal.is_admin(),
            csrf: principal.session_csrf().unwrap_or_default().to_owned(),
        }
    }

    /// Runs a page request with this chrome in effect.
    pub async fn scope<F: std::future::Future>(self, f: F) -> F::Output {
        CHROME.scope(self, f).await
    }
}

fn current() -> Chrome {
    CHROME.try_with(Chrome::clone).unwrap_or_default()
}

/// The CSRF token for the current page's forms.
pub fn csrf() -> String {
    current().csrf
}

/// The signed-in user's name, empty when nobody is.
pub fn user() -> String {
    current().user.unwrap_or_default()
}

pub fn accounts() -> bool {
    current().accounts
}

pub fn admin() -> bool {
    current().admin
}
