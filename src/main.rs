//! The `caw-box` binary: all of it lives in the library, behind `caw_box::binary::main`.

fn main() {
    caw_box::binary::main()
}
