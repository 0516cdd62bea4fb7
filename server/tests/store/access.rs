//! Effective levels: a user's level on an experiment is the highest of owner, own grant, team
//! grants and the experiment's default level.

use std::collections::BTreeMap;

use trainyard::store::accounts::Level;
use trainyard::store::DynStore;

/// The first administrator every database has (the migration creates it).
const FIRST_ADMIN_ID: &str = "00000000000000000000000000000001";

type Case = (&'static str, &'static str, Level);

/// An experiment of that test: name, owner, default level, user grants, the team's grant.
type Setup = (
    &'static str,
    &'static str,
    Level,
    &'static [(&'static str, Level)],
    Option<Level>,
);

pub async fn a_users_level_is_the_highest_of_owner_own_grant_team_grants_and_default(
    store: DynStore,
) {
    let mut users = BTreeMap::new();
    for name in ["owner", "ann", "bob", "carol"] {
        let user = store.create_user(name, None, false).await.expect("user");
        users.insert(name, user.id);
    }
    let ml = store.create_team("ml").await.expect("team");
    for member in ["ann", "bob"] {
        store
            .add_team_member(&ml.id, &users[member])
            .await
            .expect("member");
    }
    let setups: [Setup; 6] = [
        ("owned-by-ann", "ann", Level::None, &[], None),
        (
            "ann-granted-read",
            "owner",
            Level::None,
            &[("ann", Level::Read)],
            None,
        ),
        (
            "team-edit",
            "owner",
            Level::None,
            &[("ann", Level::Read)],
            Some(Level::Edit),
        ),
        (
            "default-read",
            "owner",
            Level::Read,
            &[("ann", Level::Manage)],
            None,
        ),
        (
            "default-above-grant",
            "owner",
            Level::Edit,
            &[("ann", Level::Read)],
            None,
        ),
        ("private", "owner", Level::None, &[], Some(Level::None)),
    ];
    let mut ids = BTreeMap::new();
    for (name, owner, default, grants, team) in setups {
        let e = store
            .create_experiment_owned(name, Some(&users[owner]), default)
            .await
            .expect("experiment");
        for (user, level) in grants {
            store
                .set_grant(&e.id, "user", &users[user], *level)
                .await
                .expect("user grant");
        }
        if let Some(level) = team {
            store
                .set_grant(&e.id, "team", &ml.id, level)
                .await
                .expect("team grant");
        }
        ids.insert(name, e.id);
    }
    let table: &[Case] = &[
        ("owned-by-ann", "ann", Level::Manage),
        ("owned-by-ann", "bob", Level::None),
        ("owned-by-ann", "owner", Level::None),
        ("ann-granted-read", "ann", Level::Read),
        ("ann-granted-read", "bob", Level::None),
        ("ann-granted-read", "owner", Level::Manage),
        ("team-edit", "ann", Level::Edit),
        ("team-edit", "bob", Level::Edit),
        ("team-edit", "carol", Level::None),
        ("default-read", "ann", Level::Manage),
        ("default-read", "bob", Level::Read),
        ("default-read", "carol", Level::Read),
        ("default-above-grant", "ann", Level::Edit),
        ("default-above-grant", "carol", Level::Edit),
        ("private", "owner", Level::Manage),
        ("private", "ann", Level::None),
        ("private", "carol", Level::None),
    ];
    for &(experiment, user, expected) in table {
        let level = store
            .experiment_level(&users[user], &ids[experiment])
            .await
            .expect("level");
        assert_eq!(level, expected, "{user} in {experiment}");
    }
    // The map holds exactly the experiments a user sees at all, with the same levels.
    for (user, id) in &users {
        let levels = store.experiment_levels(id).await.expect("levels");
        for (experiment, e_id) in &ids {
            let expected = store.experiment_level(id, e_id).await.expect("level");
            assert_eq!(
                levels.get(e_id).copied().unwrap_or(Level::None),
                expected,
                "{user} in {experiment}"
            );
        }
        assert!(
            !levels.values().any(|l| *l == Level::None),
            "{user}: {levels:?}"
        );
        // Default is the shared sandbox: every signed-in user may edit it.
        assert_eq!(levels.get("0"), Some(&Level::Edit), "{user} in Default");
    }
    assert_eq!(
        store
            .experiment_levels(&users["carol"])
            .await
            .expect("levels")
            .len(),
        3,
        "carol sees only the experiments with a default level (Default among them)"
    );
    let admin = store
        .experiment_levels(FIRST_ADMIN_ID)
        .await
        .expect("admin");
    assert_eq!(
        admin.get("0"),
        Some(&Level::Manage),
        "the first admin owns Default"
    );
    assert_eq!(
        store
            .experiment_level(&users["ann"], "no-such-experiment")
            .await
            .expect("level"),
        Level::None
    );
}
