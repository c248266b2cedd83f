//! `prodigy ui`.

/// `prodigy ui`.
#[derive(clap::Args)]
pub(crate) struct UiArgs {
    #[command(flatten)]
    pub(crate) quiet: crate::Quiet,
}

/// `prodigy ui`.
pub(crate) fn ui(_args: &UiArgs) -> u8 {
    crate::exit_code::OK
}
