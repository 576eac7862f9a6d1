//! Zero-copy, verified view of a `.bpte` bundled program: a `.pte` plus test cases.

use planus::ReadAsRoot;

use crate::error::{FormatError, Result};
use crate::header::check_identifier;
use crate::pte::Pte;
use crate::schema::bundled_program_flatbuffer::{BundledMethodTestSuiteRef, BundledProgramRef};
use crate::verify;

/// The `.bpte` file identifier.
pub const BUNDLED_IDENTIFIER: &str = "BP08";

/// A verified bundled program borrowing the file's bytes.
#[derive(Clone, Copy)]
pub struct Bpte<'a> {
    root: BundledProgramRef<'a>,
    program: Pte<'a>,
}

impl std::fmt::Debug for Bpte<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bpte")
            .field("program", &self.program)
            .finish()
    }
}

impl<'a> Bpte<'a> {
    /// Parses and verifies the bundle and the program embedded in it.
    pub fn parse(file: &'a [u8]) -> Result<Self> {
        check_identifier(file, BUNDLED_IDENTIFIER, "a .bpte bundled program")?;
        let root = BundledProgramRef::read_as_root(file)?;
        verify::bundled_program(root, file.len())?;
        let bytes = root
            .program()?
            .ok_or_else(|| FormatError::missing("BundledProgram.program"))?;
        let program = Pte::parse(bytes)?;
        Ok(Bpte { root, program })
    }

    /// The verified bundle table.
    pub fn root(&self) -> BundledProgramRef<'a> {
        self.root
    }

    /// The embedded program.
    pub fn program(&self) -> &Pte<'a> {
        &self.program
    }

    /// The test suites, one per method.
    pub fn test_suites(&self) -> Result<Vec<BundledMethodTestSuiteRef<'a>>> {
        Ok(self
            .root
            .method_test_suites()?
            .map(|s| s.iter().collect::<planus::Result<Vec<_>>>())
            .transpose()?
            .unwrap_or_default())
    }
}
