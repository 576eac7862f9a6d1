//! Malformed and hostile files give errors: never a panic, never a hang.

use pte_format::schema::executorch_flatbuffer as et;
use pte_format::schema::flat_tensor_flatbuffer as ft;
use pte_format::{Bpte, FormatError, ProgramHeader, Ptd, Pte};

fn fixture(rel: &str) -> Vec<u8> {
    std::fs::read(pte_testkit::fixtures_dir().join(rel)).unwrap()
}

/// Parses as whatever the bytes claim to be; only the absence of panics matters here.
fn parse_any(bytes: &[u8]) -> Result<(), FormatError> {
    match bytes.get(4..8) {
        Some(b"FT01") => Ptd::parse(bytes).map(drop),
        Some(b"BP08") => Bpte::parse(bytes).map(drop),
        _ => Pte::parse(bytes).map(drop),
    }
}

const SMALL: [&str; 3] = [
    "linear_clamp/model.pte",
    "external_constants/_default_external_constant.ptd",
    "bundled/model.bpte",
];

#[test]
fn every_truncation_is_an_error() {
    for rel in SMALL {
        let bytes = fixture(rel);
        parse_any(&bytes).unwrap();
        // Trailing zero padding of a flatbuffer may go unread; every other byte counts.
        let content = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        for len in 0..content {
            assert!(
                parse_any(&bytes[..len]).is_err(),
                "{rel} truncated to {len} bytes parsed"
            );
        }
    }
}

#[test]
fn bit_flips_in_headers_never_panic() {
    for rel in SMALL {
        let bytes = fixture(rel);
        for byte in 0..bytes.len().min(64) {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[byte] ^= 1 << bit;
                let _ = parse_any(&b);
            }
        }
    }
}

/// Overwrites every byte of the file with a few values: no panic anywhere, and among the
/// errors there must be bad union tags, bad enum values and bad offsets.
#[test]
fn corrupting_any_byte_never_panics_and_is_caught() {
    let bytes = fixture("linear_clamp/model.pte");
    let (mut unions, mut enums, mut offsets) = (0, 0, 0);
    for i in 0..bytes.len() {
        for v in [0x00u8, 0x7f, 0x80, 0xff, 0x2a] {
            let mut b = bytes.clone();
            b[i] = v;
            if let Err(e) = parse_any(&b) {
                let text = e.to_string();
                unions += usize::from(text.contains("Unknown union"));
                enums += usize::from(text.contains("Unknown enum"));
                offsets +=
                    usize::from(text.contains("Invalid offset") || text.contains("out of bounds"));
            }
        }
    }
    assert!(unions > 0, "no corruption was caught as a bad union tag");
    assert!(enums > 0, "no corruption was caught as a bad enum value");
    assert!(offsets > 0, "no corruption was caught as a bad offset");
}

fn set_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn header_offsets_past_the_end_are_errors() {
    let bytes = fixture("linear_clamp/model.pte");
    let len = bytes.len() as u64;
    let cases: [(usize, u64, &str); 5] = [
        (16, len + 1, "program_size"),
        (16, u64::MAX, "program_size"),
        (24, len + 128, "segment_base_offset"),
        (32, u64::MAX - 3, "segment_data_size"),
        (24, u64::MAX - 3, "segment_base_offset"),
    ];
    for (at, value, what) in cases {
        let mut b = bytes.clone();
        set_u64(&mut b, at, value);
        let err = Pte::parse(&b).expect_err(what);
        assert!(
            matches!(
                err,
                FormatError::OutOfBounds { .. }
                    | FormatError::Overflow { .. }
                    | FormatError::Invalid { .. }
            ),
            "{what}: {err}"
        );
    }
    // A header shorter than its 24-byte minimum.
    let mut b = bytes.clone();
    b[12..16].copy_from_slice(&8u32.to_le_bytes());
    assert!(matches!(Pte::parse(&b), Err(FormatError::BadHeader { .. })));
}

#[test]
fn ptd_header_sizes_near_2_pow_64_are_errors() {
    let bytes = fixture("external_constants/_default_external_constant.ptd");
    for at in [16usize, 24, 32, 40] {
        for value in [u64::MAX, u64::MAX - 47, bytes.len() as u64 + 1] {
            let mut b = bytes.clone();
            set_u64(&mut b, at, value);
            assert!(Ptd::parse(&b).is_err(), "FH01 field at {at} = {value}");
        }
    }
}

/// Serializes a program and puts an eh00 header in front of `data`.
fn program_file(
    program: &et::Program,
    data: &[u8],
    header: impl Fn(u64) -> ProgramHeader,
) -> Vec<u8> {
    let mut builder = planus::Builder::new();
    let bare = builder.finish(program, None).to_vec();
    let root = u32::from_le_bytes(bare[..4].try_into().unwrap()) + 40;
    let mut out = root.to_le_bytes().to_vec();
    out.extend_from_slice(b"ET12");
    let program_size = bare.len() as u64 + 40;
    let h = header(program_size);
    out.extend_from_slice(&h.to_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&bare[4..]);
    out.resize(h.segment_base_offset as usize, 0);
    out.extend_from_slice(data);
    out
}

fn segment_program(segments: Vec<et::DataSegment>) -> et::Program {
    et::Program {
        segments: Some(segments),
        constant_segment: Some(Box::new(et::SubsegmentOffsets {
            segment_index: 0,
            offsets: Some(vec![0, 0, 16]),
        })),
        execution_plan: Some(vec![]),
        ..Default::default()
    }
}

fn header_at_256(program_size: u64) -> ProgramHeader {
    assert!(program_size <= 256);
    ProgramHeader {
        length: 32,
        program_size,
        segment_base_offset: 256,
        segment_data_size: Some(32),
    }
}

#[test]
fn well_formed_hand_built_program_parses() {
    let p = segment_program(vec![et::DataSegment {
        offset: 0,
        size: 32,
    }]);
    let file = program_file(&p, &[7; 32], header_at_256);
    let pte = Pte::parse(&file).unwrap();
    assert_eq!(
        pte.constant_segment().unwrap().unwrap().get(2, 16).unwrap(),
        &[7; 16]
    );
    assert!(pte.constant_segment().unwrap().unwrap().get(2, 17).is_err());
    assert!(pte.constant_segment().unwrap().unwrap().get(3, 1).is_err());
}

#[test]
fn segment_offsets_and_sizes_near_2_pow_64_are_errors() {
    for (offset, size) in [
        (u64::MAX - 8, 16),
        (8, u64::MAX - 4),
        (u64::MAX, u64::MAX),
        (16, 32),
    ] {
        let p = segment_program(vec![et::DataSegment { offset, size }]);
        let file = program_file(&p, &[0; 32], header_at_256);
        let err = Pte::parse(&file).expect_err("bad segment");
        assert!(
            matches!(
                err,
                FormatError::OutOfBounds { .. } | FormatError::Overflow { .. }
            ),
            "offset {offset} size {size}: {err}"
        );
    }
}

#[test]
fn indices_naming_missing_segments_are_errors() {
    let mut p = segment_program(vec![et::DataSegment {
        offset: 0,
        size: 32,
    }]);
    p.constant_segment.as_mut().unwrap().segment_index = 5;
    assert!(Pte::parse(&program_file(&p, &[0; 32], header_at_256)).is_err());

    let mut p = segment_program(vec![et::DataSegment {
        offset: 0,
        size: 32,
    }]);
    p.constant_segment.as_mut().unwrap().offsets = Some(vec![0, 33]);
    assert!(Pte::parse(&program_file(&p, &[0; 32], header_at_256)).is_err());

    let mut p = segment_program(vec![et::DataSegment {
        offset: 0,
        size: 32,
    }]);
    p.named_data = Some(vec![et::NamedData {
        key: Some("w".into()),
        segment_index: u32::MAX,
    }]);
    assert!(Pte::parse(&program_file(&p, &[0; 32], header_at_256)).is_err());

    let mut p = segment_program(vec![et::DataSegment {
        offset: 0,
        size: 32,
    }]);
    p.execution_plan = Some(vec![et::ExecutionPlan {
        delegates: Some(vec![et::BackendDelegate {
            id: Some("XnnpackBackend".into()),
            processed: Some(Box::new(et::BackendDelegateDataReference {
                location: et::DataLocation::Inline,
                index: 3,
            })),
            compile_specs: None,
        }]),
        ..Default::default()
    }]);
    p.backend_delegate_data = Some(vec![]);
    let err = Pte::parse(&program_file(&p, &[0; 32], header_at_256)).unwrap_err();
    assert!(
        err.to_string().contains("delegates[0].processed.index"),
        "{err}"
    );
}

#[test]
fn ptd_layouts_with_overflowing_or_negative_sizes_are_errors() {
    for sizes in [vec![i32::MAX; 8], vec![-1, 4], vec![1 << 20, 1 << 20]] {
        let root = ft::FlatTensor {
            version: 0,
            segments: Some(vec![ft::DataSegment {
                offset: 0,
                size: 16,
            }]),
            named_data: Some(vec![ft::NamedData {
                key: Some("w".into()),
                segment_index: 0,
                tensor_layout: Some(Box::new(ft::TensorLayout {
                    scalar_type: et::ScalarType::Float,
                    dim_order: Some((0..sizes.len() as u8).collect()),
                    sizes: Some(sizes.clone()),
                })),
            }]),
        };
        let mut builder = planus::Builder::new();
        let bare = builder.finish(&root, None).to_vec();
        let mut file = (u32::from_le_bytes(bare[..4].try_into().unwrap()) + 56)
            .to_le_bytes()
            .to_vec();
        file.extend_from_slice(b"FT01");
        let header = pte_format::DataHeader {
            length: 40,
            flatbuffer_offset: 48,
            flatbuffer_size: bare.len() as u64 + 8,
            segment_base_offset: 512,
            segment_data_size: 16,
        };
        file.extend_from_slice(&header.to_bytes());
        file.extend_from_slice(&[0; 12]);
        file.extend_from_slice(&bare[4..]);
        file.resize(512 + 16, 0);
        let err = Ptd::parse(&file).expect_err("bad layout");
        assert!(
            matches!(
                err,
                FormatError::Overflow { .. }
                    | FormatError::Invalid { .. }
                    | FormatError::OutOfBounds { .. }
            ),
            "{sizes:?}: {err}"
        );
    }
}

/// Thousands of references to one large shared table: legal flatbuffers, but walking them
/// naively costs the product of the two. Verification must stop with an error, quickly.
#[test]
fn shared_subobjects_cannot_blow_up_verification() {
    let mut b = planus::Builder::new();
    let tensor = et::Tensor {
        sizes: Some(vec![1; 20_000]),
        dim_order: Some(vec![0; 20_000]),
        ..Default::default()
    };
    let value = et::EValue {
        val: Some(et::KernelTypes::Tensor(Box::new(tensor))),
    };
    let value: planus::Offset<et::EValue> = planus::WriteAsOffset::prepare(&value, &mut b);
    let values = b.create_vector(vec![value; 20_000].as_slice());
    let plan = et::ExecutionPlan::create(&mut b, "forward", (), values, (), (), (), (), (), (), ());
    let plans = b.create_vector([plan].as_slice());
    let program = et::Program::create(&mut b, 0u32, plans, (), (), (), (), (), ());
    let bare = b.finish(program, None).to_vec();
    let mut file = (u32::from_le_bytes(bare[..4].try_into().unwrap()) + 8)
        .to_le_bytes()
        .to_vec();
    file.extend_from_slice(b"ET12");
    file.extend_from_slice(&[0; 4]);
    file.extend_from_slice(&bare[4..]);
    let started = std::time::Instant::now();
    let err = Pte::parse(&file).unwrap_err();
    assert!(matches!(err, FormatError::TooComplex { .. }), "{err}");
    assert!(started.elapsed().as_secs() < 10);
}

#[test]
fn other_formats_and_versions_are_named() {
    let ptd = fixture("external_constants/_default_external_constant.ptd");
    let err = Pte::parse(&ptd).unwrap_err();
    assert!(err.to_string().contains(".ptd"), "{err}");
    let mut pte = fixture("linear_clamp/model.pte");
    pte[6..8].copy_from_slice(b"99");
    assert!(matches!(
        Pte::parse(&pte),
        Err(FormatError::UnsupportedVersion { .. })
    ));
}
