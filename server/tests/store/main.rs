//! The store test suite: every case runs against SQLite and against Postgres, each on a fresh
//! database. Postgres comes from `TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); when it is unreachable the Postgres cases
//! fail, they are never skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

#[allow(dead_code)]
#[path = "../kit/mod.rs"]
mod kit;

mod harness;

mod access;
mod catch_up;
mod downsampling;
mod experiments;
mod full_disk;
mod metrics;
mod migration;
mod nan;
mod outage;
mod registry;
mod runs;
mod search;
mod search_plans;
mod series_cache;

/// Declares each case once per backend: `sqlite::<case>` and `postgres::<case>`.
macro_rules! both_backends {
    ($($module:ident :: $case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let db = crate::harness::TestDb::sqlite().await;
                    crate::$module::$case(db.store.clone()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let db = crate::harness::TestDb::postgres().await;
                    crate::$module::$case(db.store.clone()).await;
                }
            )*
        }
    };
}

both_backends!(
    nan::a_nan_point_is_stored_and_read_back_but_is_no_extreme_or_latest_value,
    nan::a_series_of_only_nan_points_has_no_latest_value_or_extremes,
    nan::a_downsampled_read_keeps_finite_extremes_and_every_nan_point,
    nan::runs_with_a_nan_point_are_found_by_is_nan,
    access::a_users_level_is_the_highest_of_owner_own_grant_team_grants_and_default,
    experiments::the_default_experiment_exists_with_id_zero,
    experiments::creating_an_experiment_with_a_taken_name_is_a_conflict,
    experiments::an_experiment_is_found_by_id_or_by_name,
    experiments::resolving_an_unknown_name_creates_one_experiment_even_when_racing,
    experiments::an_empty_experiment_name_is_invalid,
    runs::a_created_run_reads_back_with_its_config_params_and_tags,
    runs::creating_a_run_in_an_unknown_experiment_is_not_found,
    runs::updating_a_run_merges_tags_and_sets_name_and_notes,
    runs::a_config_is_write_once,
    runs::every_operation_on_an_unknown_run_is_not_found,
    runs::set_status_stamps_times_and_records_events_in_order,
    runs::runs_with_status_lists_only_those_statuses,
    runs::racing_config_writes_leave_one_winner_and_conflicts_for_the_rest,
    runs::text_the_database_cannot_hold_is_invalid_not_a_database_error,
    metrics::a_resent_batch_stores_each_point_once_and_keeps_the_first_value,
    metrics::concurrent_writers_to_one_run_store_every_point_exactly_once,
    metrics::the_latest_metric_is_the_highest_step_not_the_last_written,
    metrics::points_since_returns_later_points_in_seq_order,
    catch_up::catching_up_from_any_position_returns_every_later_point_once_in_seq_order,
    metrics::bad_points_are_rejected_as_invalid_and_nothing_is_stored,
    metrics::the_extremes_of_each_runs_metrics_are_read_in_one_query,
    metrics::a_batch_mixing_new_and_stored_points_stores_only_the_new_ones,
    metrics::a_resent_point_with_another_value_is_reported_as_a_conflict,
    downsampling::a_series_within_the_budget_is_returned_whole,
    downsampling::a_long_series_keeps_every_spike_and_the_global_extremes,
    downsampling::step_bounds_limit_the_points_and_the_total,
    downsampling::downsampling_after_resent_batches_counts_each_point_once,
    downsampling::an_unknown_key_of_a_known_run_is_an_empty_series,
    downsampling::a_window_no_wider_than_the_budget_comes_back_whole,
    downsampling::a_sparse_window_wider_than_the_budget_fits_and_comes_back_whole,
    downsampling::a_few_far_away_steps_leave_the_dense_part_its_resolution,
    search::runs_are_found_by_status_tag_and_experiment,
    search::pagination_by_creation_time_is_stable_and_complete_with_inserts_between_pages,
    search::pagination_by_name_breaks_ties_by_id,
    search::sorting_by_a_metric_puts_runs_without_it_last,
    search::sorting_by_a_param_is_numeric_and_puts_runs_without_it_last,
    search::a_cursor_from_another_sort_or_garbage_is_invalid,
    search::a_filter_on_params_and_metrics_selects_matching_runs_across_pages,
    search_plans::every_search_shape_reads_its_page_not_the_experiment,
);

/// The model registry's cases, under `registry_suite::{sqlite,postgres}::`.
mod registry_suite {
    both_backends!(
        registry::registry_models_have_unique_names_tags_and_a_description,
        registry::registry_version_numbers_grow_per_model_and_are_never_reused,
        registry::registry_aliases_name_one_version_and_move,
        registry::registry_version_tags_and_descriptions_and_model_deletion,
    );
}
