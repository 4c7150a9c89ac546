//! Link settings of a Node.js addon (napi-build: e.g. undefined `napi_*` symbols on macOS).
fn main() {
    napi_build::setup();
}
