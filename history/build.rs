//! Rebuild when a migration changes: `sqlx::migrate!` embeds migrations/ in
//! the binary, and cargo does not otherwise know it reads those files.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
