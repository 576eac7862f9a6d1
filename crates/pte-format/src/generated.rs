pub use root::*;

const _: () = ::planus::check_version_compatibility("planus-1.3.0");

/// The root namespace
///
/// Generated from these locations:
/// * File `schema/program.fbs`
#[no_implicit_prelude]
#[allow(clippy::needless_lifetimes)]
mod root {
    /// The namespace `executorch_flatbuffer`
    ///
    /// Generated from these locations:
    /// * File `schema/program.fbs`
    /// * File `schema/scalar_type.fbs`
    pub mod executorch_flatbuffer {
        /// The table `ContainerMetadata` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `ContainerMetadata` in the file `schema/program.fbs:12`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct ContainerMetadata {
            /// The field `encoded_inp_str` in the table `ContainerMetadata`
            pub encoded_inp_str: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `encoded_out_str` in the table `ContainerMetadata`
            pub encoded_out_str: ::core::option::Option<::planus::alloc::string::String>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for ContainerMetadata {
            fn default() -> Self {
                Self {
                    encoded_inp_str: ::core::default::Default::default(),
                    encoded_out_str: ::core::default::Default::default(),
                }
            }
        }

        impl ContainerMetadata {
            /// Creates a [ContainerMetadataBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> ContainerMetadataBuilder<()> {
                ContainerMetadataBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_encoded_inp_str: impl ::planus::WriteAsOptional<
                    ::planus::Offset<::core::primitive::str>,
                >,
                field_encoded_out_str: impl ::planus::WriteAsOptional<
                    ::planus::Offset<::core::primitive::str>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_encoded_inp_str = field_encoded_inp_str.prepare(builder);
                let prepared_encoded_out_str = field_encoded_out_str.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_encoded_inp_str.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }
                if prepared_encoded_out_str.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_encoded_inp_str) =
                            prepared_encoded_inp_str
                        {
                            object_writer.write::<_, _, 4>(&prepared_encoded_inp_str);
                        }
                        if let ::core::option::Option::Some(prepared_encoded_out_str) =
                            prepared_encoded_out_str
                        {
                            object_writer.write::<_, _, 4>(&prepared_encoded_out_str);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<ContainerMetadata>> for ContainerMetadata {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ContainerMetadata> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<ContainerMetadata>> for ContainerMetadata {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<ContainerMetadata>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<ContainerMetadata> for ContainerMetadata {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ContainerMetadata> {
                ContainerMetadata::create(builder, &self.encoded_inp_str, &self.encoded_out_str)
            }
        }

        /// Builder for serializing an instance of the [ContainerMetadata] type.
        ///
        /// Can be created using the [ContainerMetadata::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct ContainerMetadataBuilder<State>(State);

        impl ContainerMetadataBuilder<()> {
            /// Setter for the [`encoded_inp_str` field](ContainerMetadata#structfield.encoded_inp_str).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn encoded_inp_str<T0>(self, value: T0) -> ContainerMetadataBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                ContainerMetadataBuilder((value,))
            }

            /// Sets the [`encoded_inp_str` field](ContainerMetadata#structfield.encoded_inp_str) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn encoded_inp_str_as_null(self) -> ContainerMetadataBuilder<((),)> {
                self.encoded_inp_str(())
            }
        }

        impl<T0> ContainerMetadataBuilder<(T0,)> {
            /// Setter for the [`encoded_out_str` field](ContainerMetadata#structfield.encoded_out_str).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn encoded_out_str<T1>(self, value: T1) -> ContainerMetadataBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                let (v0,) = self.0;
                ContainerMetadataBuilder((v0, value))
            }

            /// Sets the [`encoded_out_str` field](ContainerMetadata#structfield.encoded_out_str) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn encoded_out_str_as_null(self) -> ContainerMetadataBuilder<(T0, ())> {
                self.encoded_out_str(())
            }
        }

        impl<T0, T1> ContainerMetadataBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [ContainerMetadata].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ContainerMetadata>
            where
                Self: ::planus::WriteAsOffset<ContainerMetadata>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAs<::planus::Offset<ContainerMetadata>>
            for ContainerMetadataBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<ContainerMetadata>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ContainerMetadata> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAsOptional<::planus::Offset<ContainerMetadata>>
            for ContainerMetadataBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<ContainerMetadata>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<ContainerMetadata>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAsOffset<ContainerMetadata> for ContainerMetadataBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ContainerMetadata> {
                let (v0, v1) = &self.0;
                ContainerMetadata::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [ContainerMetadata].
        #[derive(Copy, Clone)]
        pub struct ContainerMetadataRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> ContainerMetadataRef<'a> {
            /// Getter for the [`encoded_inp_str` field](ContainerMetadata#structfield.encoded_inp_str).
            #[inline]
            pub fn encoded_inp_str(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "ContainerMetadata", "encoded_inp_str")
            }

            /// Getter for the [`encoded_out_str` field](ContainerMetadata#structfield.encoded_out_str).
            #[inline]
            pub fn encoded_out_str(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(1, "ContainerMetadata", "encoded_out_str")
            }
        }

        impl<'a> ::core::fmt::Debug for ContainerMetadataRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("ContainerMetadataRef");
                if let ::core::option::Option::Some(field_encoded_inp_str) =
                    self.encoded_inp_str().transpose()
                {
                    f.field("encoded_inp_str", &field_encoded_inp_str);
                }
                if let ::core::option::Option::Some(field_encoded_out_str) =
                    self.encoded_out_str().transpose()
                {
                    f.field("encoded_out_str", &field_encoded_out_str);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<ContainerMetadataRef<'a>> for ContainerMetadata {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: ContainerMetadataRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    encoded_inp_str: value.encoded_inp_str()?.map(::core::convert::Into::into),
                    encoded_out_str: value.encoded_out_str()?.map(::core::convert::Into::into),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for ContainerMetadataRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for ContainerMetadataRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[ContainerMetadataRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<ContainerMetadata>> for ContainerMetadata {
            type Value = ::planus::Offset<ContainerMetadata>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<ContainerMetadata>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for ContainerMetadataRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[ContainerMetadataRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Null` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Null` in the file `schema/program.fbs:17`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Null {}

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Null {
            fn default() -> Self {
                Self {}
            }
        }

        impl Null {
            /// Creates a [NullBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> NullBuilder<()> {
                NullBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(builder: &mut ::planus::Builder) -> ::planus::Offset<Self> {
                let table_writer: ::planus::table_writer::TableWriter<4> =
                    ::core::default::Default::default();
                unsafe {
                    table_writer.finish(builder, |_table_writer| {});
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Null>> for Null {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Null> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Null>> for Null {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Null>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Null> for Null {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Null> {
                Null::create(builder)
            }
        }

        /// Builder for serializing an instance of the [Null] type.
        ///
        /// Can be created using the [Null::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct NullBuilder<State>(State);

        impl NullBuilder<()> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Null].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Null>
            where
                Self: ::planus::WriteAsOffset<Null>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Null>> for NullBuilder<()> {
            type Prepared = ::planus::Offset<Null>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Null> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Null>> for NullBuilder<()> {
            type Prepared = ::planus::Offset<Null>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Null>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Null> for NullBuilder<()> {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Null> {
                Null::create(builder)
            }
        }

        /// Reference to a deserialized [Null].
        #[derive(Copy, Clone)]
        pub struct NullRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> NullRef<'a> {}

        impl<'a> ::core::fmt::Debug for NullRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("NullRef");

                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<NullRef<'a>> for Null {
            type Error = ::planus::Error;

            fn try_from(_value: NullRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {})
            }
        }

        impl<'a> ::planus::TableRead<'a> for NullRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for NullRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[NullRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Null>> for Null {
            type Value = ::planus::Offset<Null>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Null>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for NullRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[NullRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `AllocationDetails` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `AllocationDetails` in the file `schema/program.fbs:21`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct AllocationDetails {
            /// The field `memory_id` in the table `AllocationDetails`
            pub memory_id: u32,
            /// The field `memory_offset_low` in the table `AllocationDetails`
            pub memory_offset_low: u32,
            /// The field `memory_offset_high` in the table `AllocationDetails`
            pub memory_offset_high: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for AllocationDetails {
            fn default() -> Self {
                Self {
                    memory_id: 0,
                    memory_offset_low: 0,
                    memory_offset_high: 0,
                }
            }
        }

        impl AllocationDetails {
            /// Creates a [AllocationDetailsBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> AllocationDetailsBuilder<()> {
                AllocationDetailsBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_memory_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_memory_offset_low: impl ::planus::WriteAsDefault<u32, u32>,
                field_memory_offset_high: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_memory_id = field_memory_id.prepare(builder, &0);
                let prepared_memory_offset_low = field_memory_offset_low.prepare(builder, &0);
                let prepared_memory_offset_high = field_memory_offset_high.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<10> =
                    ::core::default::Default::default();
                if prepared_memory_id.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_memory_offset_low.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_memory_offset_high.is_some() {
                    table_writer.write_entry::<u32>(2);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_memory_id) = prepared_memory_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_memory_id);
                        }
                        if let ::core::option::Option::Some(prepared_memory_offset_low) =
                            prepared_memory_offset_low
                        {
                            object_writer.write::<_, _, 4>(&prepared_memory_offset_low);
                        }
                        if let ::core::option::Option::Some(prepared_memory_offset_high) =
                            prepared_memory_offset_high
                        {
                            object_writer.write::<_, _, 4>(&prepared_memory_offset_high);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<AllocationDetails>> for AllocationDetails {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<AllocationDetails> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<AllocationDetails>> for AllocationDetails {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<AllocationDetails>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<AllocationDetails> for AllocationDetails {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<AllocationDetails> {
                AllocationDetails::create(
                    builder,
                    self.memory_id,
                    self.memory_offset_low,
                    self.memory_offset_high,
                )
            }
        }

        /// Builder for serializing an instance of the [AllocationDetails] type.
        ///
        /// Can be created using the [AllocationDetails::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct AllocationDetailsBuilder<State>(State);

        impl AllocationDetailsBuilder<()> {
            /// Setter for the [`memory_id` field](AllocationDetails#structfield.memory_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn memory_id<T0>(self, value: T0) -> AllocationDetailsBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                AllocationDetailsBuilder((value,))
            }

            /// Sets the [`memory_id` field](AllocationDetails#structfield.memory_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn memory_id_as_default(
                self,
            ) -> AllocationDetailsBuilder<(::planus::DefaultValue,)> {
                self.memory_id(::planus::DefaultValue)
            }
        }

        impl<T0> AllocationDetailsBuilder<(T0,)> {
            /// Setter for the [`memory_offset_low` field](AllocationDetails#structfield.memory_offset_low).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn memory_offset_low<T1>(self, value: T1) -> AllocationDetailsBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                AllocationDetailsBuilder((v0, value))
            }

            /// Sets the [`memory_offset_low` field](AllocationDetails#structfield.memory_offset_low) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn memory_offset_low_as_default(
                self,
            ) -> AllocationDetailsBuilder<(T0, ::planus::DefaultValue)> {
                self.memory_offset_low(::planus::DefaultValue)
            }
        }

        impl<T0, T1> AllocationDetailsBuilder<(T0, T1)> {
            /// Setter for the [`memory_offset_high` field](AllocationDetails#structfield.memory_offset_high).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn memory_offset_high<T2>(self, value: T2) -> AllocationDetailsBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                AllocationDetailsBuilder((v0, v1, value))
            }

            /// Sets the [`memory_offset_high` field](AllocationDetails#structfield.memory_offset_high) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn memory_offset_high_as_default(
                self,
            ) -> AllocationDetailsBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.memory_offset_high(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> AllocationDetailsBuilder<(T0, T1, T2)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [AllocationDetails].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<AllocationDetails>
            where
                Self: ::planus::WriteAsOffset<AllocationDetails>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<AllocationDetails>>
            for AllocationDetailsBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<AllocationDetails>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<AllocationDetails> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<AllocationDetails>>
            for AllocationDetailsBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<AllocationDetails>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<AllocationDetails>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<AllocationDetails>
            for AllocationDetailsBuilder<(T0, T1, T2)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<AllocationDetails> {
                let (v0, v1, v2) = &self.0;
                AllocationDetails::create(builder, v0, v1, v2)
            }
        }

        /// Reference to a deserialized [AllocationDetails].
        #[derive(Copy, Clone)]
        pub struct AllocationDetailsRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> AllocationDetailsRef<'a> {
            /// Getter for the [`memory_id` field](AllocationDetails#structfield.memory_id).
            #[inline]
            pub fn memory_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "AllocationDetails", "memory_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`memory_offset_low` field](AllocationDetails#structfield.memory_offset_low).
            #[inline]
            pub fn memory_offset_low(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "AllocationDetails", "memory_offset_low")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`memory_offset_high` field](AllocationDetails#structfield.memory_offset_high).
            #[inline]
            pub fn memory_offset_high(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "AllocationDetails", "memory_offset_high")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for AllocationDetailsRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("AllocationDetailsRef");
                f.field("memory_id", &self.memory_id());
                f.field("memory_offset_low", &self.memory_offset_low());
                f.field("memory_offset_high", &self.memory_offset_high());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<AllocationDetailsRef<'a>> for AllocationDetails {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: AllocationDetailsRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    memory_id: ::core::convert::TryInto::try_into(value.memory_id()?)?,
                    memory_offset_low: ::core::convert::TryInto::try_into(
                        value.memory_offset_low()?,
                    )?,
                    memory_offset_high: ::core::convert::TryInto::try_into(
                        value.memory_offset_high()?,
                    )?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for AllocationDetailsRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for AllocationDetailsRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[AllocationDetailsRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<AllocationDetails>> for AllocationDetails {
            type Value = ::planus::Offset<AllocationDetails>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<AllocationDetails>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for AllocationDetailsRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[AllocationDetailsRef]", "read_as_root", 0)
                })
            }
        }

        /// The enum `TensorShapeDynamism` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Enum `TensorShapeDynamism` in the file `schema/program.fbs:27`
        #[derive(
            Copy,
            Clone,
            Debug,
            PartialEq,
            Eq,
            PartialOrd,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        #[repr(i8)]
        pub enum TensorShapeDynamism {
            /// The variant `STATIC` in the enum `TensorShapeDynamism`
            Static = 0,

            /// The variant `DYNAMIC_BOUND` in the enum `TensorShapeDynamism`
            DynamicBound = 1,

            /// The variant `DYNAMIC_UNBOUND` in the enum `TensorShapeDynamism`
            DynamicUnbound = 2,
        }

        impl TensorShapeDynamism {
            /// Array containing all valid variants of TensorShapeDynamism
            pub const ENUM_VALUES: [Self; 3] =
                [Self::Static, Self::DynamicBound, Self::DynamicUnbound];
        }

        impl ::core::convert::TryFrom<i8> for TensorShapeDynamism {
            type Error = ::planus::errors::UnknownEnumTagKind;
            #[inline]
            fn try_from(
                value: i8,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTagKind> {
                #[allow(clippy::match_single_binding)]
                match value {
                    0 => ::core::result::Result::Ok(TensorShapeDynamism::Static),
                    1 => ::core::result::Result::Ok(TensorShapeDynamism::DynamicBound),
                    2 => ::core::result::Result::Ok(TensorShapeDynamism::DynamicUnbound),

                    _ => ::core::result::Result::Err(::planus::errors::UnknownEnumTagKind {
                        tag: value as i128,
                    }),
                }
            }
        }

        impl ::core::convert::From<TensorShapeDynamism> for i8 {
            #[inline]
            fn from(value: TensorShapeDynamism) -> Self {
                value as i8
            }
        }

        /// # Safety
        /// The Planus compiler correctly calculates `ALIGNMENT` and `SIZE`.
        unsafe impl ::planus::Primitive for TensorShapeDynamism {
            const ALIGNMENT: usize = 1;
            const SIZE: usize = 1;
        }

        impl ::planus::WriteAsPrimitive<TensorShapeDynamism> for TensorShapeDynamism {
            #[inline]
            fn write<const N: usize>(&self, cursor: ::planus::Cursor<'_, N>, buffer_position: u32) {
                (*self as i8).write(cursor, buffer_position);
            }
        }

        impl ::planus::WriteAs<TensorShapeDynamism> for TensorShapeDynamism {
            type Prepared = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> TensorShapeDynamism {
                *self
            }
        }

        impl ::planus::WriteAsDefault<TensorShapeDynamism, TensorShapeDynamism> for TensorShapeDynamism {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
                default: &TensorShapeDynamism,
            ) -> ::core::option::Option<TensorShapeDynamism> {
                if self == default {
                    ::core::option::Option::None
                } else {
                    ::core::option::Option::Some(*self)
                }
            }
        }

        impl ::planus::WriteAsOptional<TensorShapeDynamism> for TensorShapeDynamism {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<TensorShapeDynamism> {
                ::core::option::Option::Some(*self)
            }
        }

        impl<'buf> ::planus::TableRead<'buf> for TensorShapeDynamism {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                let n: i8 = ::planus::TableRead::from_buffer(buffer, offset)?;
                ::core::result::Result::Ok(::core::convert::TryInto::try_into(n)?)
            }
        }

        impl<'buf> ::planus::VectorReadInner<'buf> for TensorShapeDynamism {
            type Error = ::planus::errors::UnknownEnumTag;
            const STRIDE: usize = 1;
            #[inline]
            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTag> {
                let value = unsafe { *buffer.buffer.get_unchecked(offset) as i8 };
                let value: ::core::result::Result<Self, _> =
                    ::core::convert::TryInto::try_into(value);
                value.map_err(|error_kind| {
                    error_kind.with_error_location(
                        "TensorShapeDynamism",
                        "VectorRead::from_buffer",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<TensorShapeDynamism> for TensorShapeDynamism {
            const STRIDE: usize = 1;

            type Value = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> Self {
                *self
            }

            #[inline]
            unsafe fn write_values(
                values: &[Self],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 1];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - i as u32,
                    );
                }
            }
        }

        /// The enum `TensorDataLocation` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Enum `TensorDataLocation` in the file `schema/program.fbs:33`
        #[derive(
            Copy,
            Clone,
            Debug,
            PartialEq,
            Eq,
            PartialOrd,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        #[repr(i8)]
        pub enum TensorDataLocation {
            /// The variant `SEGMENT` in the enum `TensorDataLocation`
            Segment = 0,

            /// The variant `EXTERNAL` in the enum `TensorDataLocation`
            External = 1,
        }

        impl TensorDataLocation {
            /// Array containing all valid variants of TensorDataLocation
            pub const ENUM_VALUES: [Self; 2] = [Self::Segment, Self::External];
        }

        impl ::core::convert::TryFrom<i8> for TensorDataLocation {
            type Error = ::planus::errors::UnknownEnumTagKind;
            #[inline]
            fn try_from(
                value: i8,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTagKind> {
                #[allow(clippy::match_single_binding)]
                match value {
                    0 => ::core::result::Result::Ok(TensorDataLocation::Segment),
                    1 => ::core::result::Result::Ok(TensorDataLocation::External),

                    _ => ::core::result::Result::Err(::planus::errors::UnknownEnumTagKind {
                        tag: value as i128,
                    }),
                }
            }
        }

        impl ::core::convert::From<TensorDataLocation> for i8 {
            #[inline]
            fn from(value: TensorDataLocation) -> Self {
                value as i8
            }
        }

        /// # Safety
        /// The Planus compiler correctly calculates `ALIGNMENT` and `SIZE`.
        unsafe impl ::planus::Primitive for TensorDataLocation {
            const ALIGNMENT: usize = 1;
            const SIZE: usize = 1;
        }

        impl ::planus::WriteAsPrimitive<TensorDataLocation> for TensorDataLocation {
            #[inline]
            fn write<const N: usize>(&self, cursor: ::planus::Cursor<'_, N>, buffer_position: u32) {
                (*self as i8).write(cursor, buffer_position);
            }
        }

        impl ::planus::WriteAs<TensorDataLocation> for TensorDataLocation {
            type Prepared = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> TensorDataLocation {
                *self
            }
        }

        impl ::planus::WriteAsDefault<TensorDataLocation, TensorDataLocation> for TensorDataLocation {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
                default: &TensorDataLocation,
            ) -> ::core::option::Option<TensorDataLocation> {
                if self == default {
                    ::core::option::Option::None
                } else {
                    ::core::option::Option::Some(*self)
                }
            }
        }

        impl ::planus::WriteAsOptional<TensorDataLocation> for TensorDataLocation {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<TensorDataLocation> {
                ::core::option::Option::Some(*self)
            }
        }

        impl<'buf> ::planus::TableRead<'buf> for TensorDataLocation {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                let n: i8 = ::planus::TableRead::from_buffer(buffer, offset)?;
                ::core::result::Result::Ok(::core::convert::TryInto::try_into(n)?)
            }
        }

        impl<'buf> ::planus::VectorReadInner<'buf> for TensorDataLocation {
            type Error = ::planus::errors::UnknownEnumTag;
            const STRIDE: usize = 1;
            #[inline]
            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTag> {
                let value = unsafe { *buffer.buffer.get_unchecked(offset) as i8 };
                let value: ::core::result::Result<Self, _> =
                    ::core::convert::TryInto::try_into(value);
                value.map_err(|error_kind| {
                    error_kind.with_error_location(
                        "TensorDataLocation",
                        "VectorRead::from_buffer",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<TensorDataLocation> for TensorDataLocation {
            const STRIDE: usize = 1;

            type Value = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> Self {
                *self
            }

            #[inline]
            unsafe fn write_values(
                values: &[Self],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 1];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - i as u32,
                    );
                }
            }
        }

        /// The enum `DeviceType` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Enum `DeviceType` in the file `schema/program.fbs:38`
        #[derive(
            Copy,
            Clone,
            Debug,
            PartialEq,
            Eq,
            PartialOrd,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        #[repr(i8)]
        pub enum DeviceType {
            /// The variant `CPU` in the enum `DeviceType`
            Cpu = 0,

            /// The variant `CUDA` in the enum `DeviceType`
            Cuda = 1,
        }

        impl DeviceType {
            /// Array containing all valid variants of DeviceType
            pub const ENUM_VALUES: [Self; 2] = [Self::Cpu, Self::Cuda];
        }

        impl ::core::convert::TryFrom<i8> for DeviceType {
            type Error = ::planus::errors::UnknownEnumTagKind;
            #[inline]
            fn try_from(
                value: i8,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTagKind> {
                #[allow(clippy::match_single_binding)]
                match value {
                    0 => ::core::result::Result::Ok(DeviceType::Cpu),
                    1 => ::core::result::Result::Ok(DeviceType::Cuda),

                    _ => ::core::result::Result::Err(::planus::errors::UnknownEnumTagKind {
                        tag: value as i128,
                    }),
                }
            }
        }

        impl ::core::convert::From<DeviceType> for i8 {
            #[inline]
            fn from(value: DeviceType) -> Self {
                value as i8
            }
        }

        /// # Safety
        /// The Planus compiler correctly calculates `ALIGNMENT` and `SIZE`.
        unsafe impl ::planus::Primitive for DeviceType {
            const ALIGNMENT: usize = 1;
            const SIZE: usize = 1;
        }

        impl ::planus::WriteAsPrimitive<DeviceType> for DeviceType {
            #[inline]
            fn write<const N: usize>(&self, cursor: ::planus::Cursor<'_, N>, buffer_position: u32) {
                (*self as i8).write(cursor, buffer_position);
            }
        }

        impl ::planus::WriteAs<DeviceType> for DeviceType {
            type Prepared = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> DeviceType {
                *self
            }
        }

        impl ::planus::WriteAsDefault<DeviceType, DeviceType> for DeviceType {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
                default: &DeviceType,
            ) -> ::core::option::Option<DeviceType> {
                if self == default {
                    ::core::option::Option::None
                } else {
                    ::core::option::Option::Some(*self)
                }
            }
        }

        impl ::planus::WriteAsOptional<DeviceType> for DeviceType {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<DeviceType> {
                ::core::option::Option::Some(*self)
            }
        }

        impl<'buf> ::planus::TableRead<'buf> for DeviceType {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                let n: i8 = ::planus::TableRead::from_buffer(buffer, offset)?;
                ::core::result::Result::Ok(::core::convert::TryInto::try_into(n)?)
            }
        }

        impl<'buf> ::planus::VectorReadInner<'buf> for DeviceType {
            type Error = ::planus::errors::UnknownEnumTag;
            const STRIDE: usize = 1;
            #[inline]
            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTag> {
                let value = unsafe { *buffer.buffer.get_unchecked(offset) as i8 };
                let value: ::core::result::Result<Self, _> =
                    ::core::convert::TryInto::try_into(value);
                value.map_err(|error_kind| {
                    error_kind.with_error_location(
                        "DeviceType",
                        "VectorRead::from_buffer",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<DeviceType> for DeviceType {
            const STRIDE: usize = 1;

            type Value = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> Self {
                *self
            }

            #[inline]
            unsafe fn write_values(
                values: &[Self],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 1];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - i as u32,
                    );
                }
            }
        }

        /// The table `ExtraTensorInfo` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `ExtraTensorInfo` in the file `schema/program.fbs:43`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct ExtraTensorInfo {
            /// The field `mutable_data_segments_idx` in the table `ExtraTensorInfo`
            pub mutable_data_segments_idx: u64,
            /// The field `fully_qualified_name` in the table `ExtraTensorInfo`
            pub fully_qualified_name: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `location` in the table `ExtraTensorInfo`
            pub location: self::TensorDataLocation,
            /// The field `device_type` in the table `ExtraTensorInfo`
            pub device_type: self::DeviceType,
            /// The field `device_index` in the table `ExtraTensorInfo`
            pub device_index: i8,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for ExtraTensorInfo {
            fn default() -> Self {
                Self {
                    mutable_data_segments_idx: 0,
                    fully_qualified_name: ::core::default::Default::default(),
                    location: self::TensorDataLocation::Segment,
                    device_type: self::DeviceType::Cpu,
                    device_index: 0,
                }
            }
        }

        impl ExtraTensorInfo {
            /// Creates a [ExtraTensorInfoBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> ExtraTensorInfoBuilder<()> {
                ExtraTensorInfoBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_mutable_data_segments_idx: impl ::planus::WriteAsDefault<u64, u64>,
                field_fully_qualified_name: impl ::planus::WriteAsOptional<
                    ::planus::Offset<::core::primitive::str>,
                >,
                field_location: impl ::planus::WriteAsDefault<
                    self::TensorDataLocation,
                    self::TensorDataLocation,
                >,
                field_device_type: impl ::planus::WriteAsDefault<self::DeviceType, self::DeviceType>,
                field_device_index: impl ::planus::WriteAsDefault<i8, i8>,
            ) -> ::planus::Offset<Self> {
                let prepared_mutable_data_segments_idx =
                    field_mutable_data_segments_idx.prepare(builder, &0);
                let prepared_fully_qualified_name = field_fully_qualified_name.prepare(builder);
                let prepared_location =
                    field_location.prepare(builder, &self::TensorDataLocation::Segment);
                let prepared_device_type =
                    field_device_type.prepare(builder, &self::DeviceType::Cpu);
                let prepared_device_index = field_device_index.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<14> =
                    ::core::default::Default::default();
                if prepared_mutable_data_segments_idx.is_some() {
                    table_writer.write_entry::<u64>(0);
                }
                if prepared_fully_qualified_name.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(1);
                }
                if prepared_location.is_some() {
                    table_writer.write_entry::<self::TensorDataLocation>(2);
                }
                if prepared_device_type.is_some() {
                    table_writer.write_entry::<self::DeviceType>(3);
                }
                if prepared_device_index.is_some() {
                    table_writer.write_entry::<i8>(4);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_mutable_data_segments_idx) =
                            prepared_mutable_data_segments_idx
                        {
                            object_writer.write::<_, _, 8>(&prepared_mutable_data_segments_idx);
                        }
                        if let ::core::option::Option::Some(prepared_fully_qualified_name) =
                            prepared_fully_qualified_name
                        {
                            object_writer.write::<_, _, 4>(&prepared_fully_qualified_name);
                        }
                        if let ::core::option::Option::Some(prepared_location) = prepared_location {
                            object_writer.write::<_, _, 1>(&prepared_location);
                        }
                        if let ::core::option::Option::Some(prepared_device_type) =
                            prepared_device_type
                        {
                            object_writer.write::<_, _, 1>(&prepared_device_type);
                        }
                        if let ::core::option::Option::Some(prepared_device_index) =
                            prepared_device_index
                        {
                            object_writer.write::<_, _, 1>(&prepared_device_index);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<ExtraTensorInfo>> for ExtraTensorInfo {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ExtraTensorInfo> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<ExtraTensorInfo>> for ExtraTensorInfo {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<ExtraTensorInfo>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<ExtraTensorInfo> for ExtraTensorInfo {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ExtraTensorInfo> {
                ExtraTensorInfo::create(
                    builder,
                    self.mutable_data_segments_idx,
                    &self.fully_qualified_name,
                    self.location,
                    self.device_type,
                    self.device_index,
                )
            }
        }

        /// Builder for serializing an instance of the [ExtraTensorInfo] type.
        ///
        /// Can be created using the [ExtraTensorInfo::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct ExtraTensorInfoBuilder<State>(State);

        impl ExtraTensorInfoBuilder<()> {
            /// Setter for the [`mutable_data_segments_idx` field](ExtraTensorInfo#structfield.mutable_data_segments_idx).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn mutable_data_segments_idx<T0>(self, value: T0) -> ExtraTensorInfoBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u64, u64>,
            {
                ExtraTensorInfoBuilder((value,))
            }

            /// Sets the [`mutable_data_segments_idx` field](ExtraTensorInfo#structfield.mutable_data_segments_idx) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn mutable_data_segments_idx_as_default(
                self,
            ) -> ExtraTensorInfoBuilder<(::planus::DefaultValue,)> {
                self.mutable_data_segments_idx(::planus::DefaultValue)
            }
        }

        impl<T0> ExtraTensorInfoBuilder<(T0,)> {
            /// Setter for the [`fully_qualified_name` field](ExtraTensorInfo#structfield.fully_qualified_name).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn fully_qualified_name<T1>(self, value: T1) -> ExtraTensorInfoBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                let (v0,) = self.0;
                ExtraTensorInfoBuilder((v0, value))
            }

            /// Sets the [`fully_qualified_name` field](ExtraTensorInfo#structfield.fully_qualified_name) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn fully_qualified_name_as_null(self) -> ExtraTensorInfoBuilder<(T0, ())> {
                self.fully_qualified_name(())
            }
        }

        impl<T0, T1> ExtraTensorInfoBuilder<(T0, T1)> {
            /// Setter for the [`location` field](ExtraTensorInfo#structfield.location).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn location<T2>(self, value: T2) -> ExtraTensorInfoBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<self::TensorDataLocation, self::TensorDataLocation>,
            {
                let (v0, v1) = self.0;
                ExtraTensorInfoBuilder((v0, v1, value))
            }

            /// Sets the [`location` field](ExtraTensorInfo#structfield.location) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn location_as_default(
                self,
            ) -> ExtraTensorInfoBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.location(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> ExtraTensorInfoBuilder<(T0, T1, T2)> {
            /// Setter for the [`device_type` field](ExtraTensorInfo#structfield.device_type).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn device_type<T3>(self, value: T3) -> ExtraTensorInfoBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<self::DeviceType, self::DeviceType>,
            {
                let (v0, v1, v2) = self.0;
                ExtraTensorInfoBuilder((v0, v1, v2, value))
            }

            /// Sets the [`device_type` field](ExtraTensorInfo#structfield.device_type) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn device_type_as_default(
                self,
            ) -> ExtraTensorInfoBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.device_type(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> ExtraTensorInfoBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`device_index` field](ExtraTensorInfo#structfield.device_index).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn device_index<T4>(self, value: T4) -> ExtraTensorInfoBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<i8, i8>,
            {
                let (v0, v1, v2, v3) = self.0;
                ExtraTensorInfoBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`device_index` field](ExtraTensorInfo#structfield.device_index) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn device_index_as_default(
                self,
            ) -> ExtraTensorInfoBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.device_index(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> ExtraTensorInfoBuilder<(T0, T1, T2, T3, T4)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [ExtraTensorInfo].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ExtraTensorInfo>
            where
                Self: ::planus::WriteAsOffset<ExtraTensorInfo>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u64, u64>,
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T2: ::planus::WriteAsDefault<self::TensorDataLocation, self::TensorDataLocation>,
                T3: ::planus::WriteAsDefault<self::DeviceType, self::DeviceType>,
                T4: ::planus::WriteAsDefault<i8, i8>,
            > ::planus::WriteAs<::planus::Offset<ExtraTensorInfo>>
            for ExtraTensorInfoBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<ExtraTensorInfo>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ExtraTensorInfo> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u64, u64>,
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T2: ::planus::WriteAsDefault<self::TensorDataLocation, self::TensorDataLocation>,
                T3: ::planus::WriteAsDefault<self::DeviceType, self::DeviceType>,
                T4: ::planus::WriteAsDefault<i8, i8>,
            > ::planus::WriteAsOptional<::planus::Offset<ExtraTensorInfo>>
            for ExtraTensorInfoBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<ExtraTensorInfo>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<ExtraTensorInfo>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u64, u64>,
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T2: ::planus::WriteAsDefault<self::TensorDataLocation, self::TensorDataLocation>,
                T3: ::planus::WriteAsDefault<self::DeviceType, self::DeviceType>,
                T4: ::planus::WriteAsDefault<i8, i8>,
            > ::planus::WriteAsOffset<ExtraTensorInfo>
            for ExtraTensorInfoBuilder<(T0, T1, T2, T3, T4)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ExtraTensorInfo> {
                let (v0, v1, v2, v3, v4) = &self.0;
                ExtraTensorInfo::create(builder, v0, v1, v2, v3, v4)
            }
        }

        /// Reference to a deserialized [ExtraTensorInfo].
        #[derive(Copy, Clone)]
        pub struct ExtraTensorInfoRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> ExtraTensorInfoRef<'a> {
            /// Getter for the [`mutable_data_segments_idx` field](ExtraTensorInfo#structfield.mutable_data_segments_idx).
            #[inline]
            pub fn mutable_data_segments_idx(&self) -> ::planus::Result<u64> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "ExtraTensorInfo", "mutable_data_segments_idx")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`fully_qualified_name` field](ExtraTensorInfo#structfield.fully_qualified_name).
            #[inline]
            pub fn fully_qualified_name(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(1, "ExtraTensorInfo", "fully_qualified_name")
            }

            /// Getter for the [`location` field](ExtraTensorInfo#structfield.location).
            #[inline]
            pub fn location(&self) -> ::planus::Result<self::TensorDataLocation> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "ExtraTensorInfo", "location")?
                        .unwrap_or(self::TensorDataLocation::Segment),
                )
            }

            /// Getter for the [`device_type` field](ExtraTensorInfo#structfield.device_type).
            #[inline]
            pub fn device_type(&self) -> ::planus::Result<self::DeviceType> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "ExtraTensorInfo", "device_type")?
                        .unwrap_or(self::DeviceType::Cpu),
                )
            }

            /// Getter for the [`device_index` field](ExtraTensorInfo#structfield.device_index).
            #[inline]
            pub fn device_index(&self) -> ::planus::Result<i8> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "ExtraTensorInfo", "device_index")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for ExtraTensorInfoRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("ExtraTensorInfoRef");
                f.field(
                    "mutable_data_segments_idx",
                    &self.mutable_data_segments_idx(),
                );
                if let ::core::option::Option::Some(field_fully_qualified_name) =
                    self.fully_qualified_name().transpose()
                {
                    f.field("fully_qualified_name", &field_fully_qualified_name);
                }
                f.field("location", &self.location());
                f.field("device_type", &self.device_type());
                f.field("device_index", &self.device_index());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<ExtraTensorInfoRef<'a>> for ExtraTensorInfo {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: ExtraTensorInfoRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    mutable_data_segments_idx: ::core::convert::TryInto::try_into(
                        value.mutable_data_segments_idx()?,
                    )?,
                    fully_qualified_name: value
                        .fully_qualified_name()?
                        .map(::core::convert::Into::into),
                    location: ::core::convert::TryInto::try_into(value.location()?)?,
                    device_type: ::core::convert::TryInto::try_into(value.device_type()?)?,
                    device_index: ::core::convert::TryInto::try_into(value.device_index()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for ExtraTensorInfoRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for ExtraTensorInfoRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[ExtraTensorInfoRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<ExtraTensorInfo>> for ExtraTensorInfo {
            type Value = ::planus::Offset<ExtraTensorInfo>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<ExtraTensorInfo>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for ExtraTensorInfoRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[ExtraTensorInfoRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Tensor` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Tensor` in the file `schema/program.fbs:51`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Tensor {
            /// The field `scalar_type` in the table `Tensor`
            pub scalar_type: self::ScalarType,
            /// The field `storage_offset` in the table `Tensor`
            pub storage_offset: i32,
            /// The field `sizes` in the table `Tensor`
            pub sizes: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
            /// The field `dim_order` in the table `Tensor`
            pub dim_order: ::core::option::Option<::planus::alloc::vec::Vec<u8>>,
            /// The field `requires_grad` in the table `Tensor`
            pub requires_grad: bool,
            /// The field `data_buffer_idx` in the table `Tensor`
            pub data_buffer_idx: u32,
            /// The field `allocation_info` in the table `Tensor`
            pub allocation_info:
                ::core::option::Option<::planus::alloc::boxed::Box<self::AllocationDetails>>,
            /// The field `layout` in the table `Tensor`
            pub layout: i8,
            /// The field `shape_dynamism` in the table `Tensor`
            pub shape_dynamism: self::TensorShapeDynamism,
            /// The field `extra_tensor_info` in the table `Tensor`
            pub extra_tensor_info:
                ::core::option::Option<::planus::alloc::boxed::Box<self::ExtraTensorInfo>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Tensor {
            fn default() -> Self {
                Self {
                    scalar_type: self::ScalarType::Byte,
                    storage_offset: 0,
                    sizes: ::core::default::Default::default(),
                    dim_order: ::core::default::Default::default(),
                    requires_grad: false,
                    data_buffer_idx: 0,
                    allocation_info: ::core::default::Default::default(),
                    layout: 0,
                    shape_dynamism: self::TensorShapeDynamism::Static,
                    extra_tensor_info: ::core::default::Default::default(),
                }
            }
        }

        impl Tensor {
            /// Creates a [TensorBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> TensorBuilder<()> {
                TensorBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_scalar_type: impl ::planus::WriteAsDefault<self::ScalarType, self::ScalarType>,
                field_storage_offset: impl ::planus::WriteAsDefault<i32, i32>,
                field_sizes: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                field_dim_order: impl ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
                field_requires_grad: impl ::planus::WriteAsDefault<bool, bool>,
                field_data_buffer_idx: impl ::planus::WriteAsDefault<u32, u32>,
                field_allocation_info: impl ::planus::WriteAsOptional<
                    ::planus::Offset<self::AllocationDetails>,
                >,
                field_layout: impl ::planus::WriteAsDefault<i8, i8>,
                field_shape_dynamism: impl ::planus::WriteAsDefault<
                    self::TensorShapeDynamism,
                    self::TensorShapeDynamism,
                >,
                field_extra_tensor_info: impl ::planus::WriteAsOptional<
                    ::planus::Offset<self::ExtraTensorInfo>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_scalar_type =
                    field_scalar_type.prepare(builder, &self::ScalarType::Byte);
                let prepared_storage_offset = field_storage_offset.prepare(builder, &0);
                let prepared_sizes = field_sizes.prepare(builder);
                let prepared_dim_order = field_dim_order.prepare(builder);
                let prepared_requires_grad = field_requires_grad.prepare(builder, &false);
                let prepared_data_buffer_idx = field_data_buffer_idx.prepare(builder, &0);
                let prepared_allocation_info = field_allocation_info.prepare(builder);
                let prepared_layout = field_layout.prepare(builder, &0);
                let prepared_shape_dynamism =
                    field_shape_dynamism.prepare(builder, &self::TensorShapeDynamism::Static);
                let prepared_extra_tensor_info = field_extra_tensor_info.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<24> =
                    ::core::default::Default::default();
                if prepared_storage_offset.is_some() {
                    table_writer.write_entry::<i32>(1);
                }
                if prepared_sizes.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(2);
                }
                if prepared_dim_order.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u8]>>(3);
                }
                if prepared_data_buffer_idx.is_some() {
                    table_writer.write_entry::<u32>(5);
                }
                if prepared_allocation_info.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::AllocationDetails>>(6);
                }
                if prepared_extra_tensor_info.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::ExtraTensorInfo>>(9);
                }
                if prepared_scalar_type.is_some() {
                    table_writer.write_entry::<self::ScalarType>(0);
                }
                if prepared_requires_grad.is_some() {
                    table_writer.write_entry::<bool>(4);
                }
                if prepared_layout.is_some() {
                    table_writer.write_entry::<i8>(7);
                }
                if prepared_shape_dynamism.is_some() {
                    table_writer.write_entry::<self::TensorShapeDynamism>(8);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_storage_offset) =
                            prepared_storage_offset
                        {
                            object_writer.write::<_, _, 4>(&prepared_storage_offset);
                        }
                        if let ::core::option::Option::Some(prepared_sizes) = prepared_sizes {
                            object_writer.write::<_, _, 4>(&prepared_sizes);
                        }
                        if let ::core::option::Option::Some(prepared_dim_order) = prepared_dim_order
                        {
                            object_writer.write::<_, _, 4>(&prepared_dim_order);
                        }
                        if let ::core::option::Option::Some(prepared_data_buffer_idx) =
                            prepared_data_buffer_idx
                        {
                            object_writer.write::<_, _, 4>(&prepared_data_buffer_idx);
                        }
                        if let ::core::option::Option::Some(prepared_allocation_info) =
                            prepared_allocation_info
                        {
                            object_writer.write::<_, _, 4>(&prepared_allocation_info);
                        }
                        if let ::core::option::Option::Some(prepared_extra_tensor_info) =
                            prepared_extra_tensor_info
                        {
                            object_writer.write::<_, _, 4>(&prepared_extra_tensor_info);
                        }
                        if let ::core::option::Option::Some(prepared_scalar_type) =
                            prepared_scalar_type
                        {
                            object_writer.write::<_, _, 1>(&prepared_scalar_type);
                        }
                        if let ::core::option::Option::Some(prepared_requires_grad) =
                            prepared_requires_grad
                        {
                            object_writer.write::<_, _, 1>(&prepared_requires_grad);
                        }
                        if let ::core::option::Option::Some(prepared_layout) = prepared_layout {
                            object_writer.write::<_, _, 1>(&prepared_layout);
                        }
                        if let ::core::option::Option::Some(prepared_shape_dynamism) =
                            prepared_shape_dynamism
                        {
                            object_writer.write::<_, _, 1>(&prepared_shape_dynamism);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Tensor>> for Tensor {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Tensor> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Tensor>> for Tensor {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Tensor>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Tensor> for Tensor {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Tensor> {
                Tensor::create(
                    builder,
                    self.scalar_type,
                    self.storage_offset,
                    &self.sizes,
                    &self.dim_order,
                    self.requires_grad,
                    self.data_buffer_idx,
                    &self.allocation_info,
                    self.layout,
                    self.shape_dynamism,
                    &self.extra_tensor_info,
                )
            }
        }

        /// Builder for serializing an instance of the [Tensor] type.
        ///
        /// Can be created using the [Tensor::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct TensorBuilder<State>(State);

        impl TensorBuilder<()> {
            /// Setter for the [`scalar_type` field](Tensor#structfield.scalar_type).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scalar_type<T0>(self, value: T0) -> TensorBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<self::ScalarType, self::ScalarType>,
            {
                TensorBuilder((value,))
            }

            /// Sets the [`scalar_type` field](Tensor#structfield.scalar_type) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scalar_type_as_default(self) -> TensorBuilder<(::planus::DefaultValue,)> {
                self.scalar_type(::planus::DefaultValue)
            }
        }

        impl<T0> TensorBuilder<(T0,)> {
            /// Setter for the [`storage_offset` field](Tensor#structfield.storage_offset).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn storage_offset<T1>(self, value: T1) -> TensorBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<i32, i32>,
            {
                let (v0,) = self.0;
                TensorBuilder((v0, value))
            }

            /// Sets the [`storage_offset` field](Tensor#structfield.storage_offset) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn storage_offset_as_default(self) -> TensorBuilder<(T0, ::planus::DefaultValue)> {
                self.storage_offset(::planus::DefaultValue)
            }
        }

        impl<T0, T1> TensorBuilder<(T0, T1)> {
            /// Setter for the [`sizes` field](Tensor#structfield.sizes).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn sizes<T2>(self, value: T2) -> TensorBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                let (v0, v1) = self.0;
                TensorBuilder((v0, v1, value))
            }

            /// Sets the [`sizes` field](Tensor#structfield.sizes) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn sizes_as_null(self) -> TensorBuilder<(T0, T1, ())> {
                self.sizes(())
            }
        }

        impl<T0, T1, T2> TensorBuilder<(T0, T1, T2)> {
            /// Setter for the [`dim_order` field](Tensor#structfield.dim_order).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dim_order<T3>(self, value: T3) -> TensorBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            {
                let (v0, v1, v2) = self.0;
                TensorBuilder((v0, v1, v2, value))
            }

            /// Sets the [`dim_order` field](Tensor#structfield.dim_order) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dim_order_as_null(self) -> TensorBuilder<(T0, T1, T2, ())> {
                self.dim_order(())
            }
        }

        impl<T0, T1, T2, T3> TensorBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`requires_grad` field](Tensor#structfield.requires_grad).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn requires_grad<T4>(self, value: T4) -> TensorBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<bool, bool>,
            {
                let (v0, v1, v2, v3) = self.0;
                TensorBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`requires_grad` field](Tensor#structfield.requires_grad) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn requires_grad_as_default(
                self,
            ) -> TensorBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.requires_grad(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> TensorBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`data_buffer_idx` field](Tensor#structfield.data_buffer_idx).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn data_buffer_idx<T5>(self, value: T5) -> TensorBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                TensorBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`data_buffer_idx` field](Tensor#structfield.data_buffer_idx) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn data_buffer_idx_as_default(
                self,
            ) -> TensorBuilder<(T0, T1, T2, T3, T4, ::planus::DefaultValue)> {
                self.data_buffer_idx(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5> TensorBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Setter for the [`allocation_info` field](Tensor#structfield.allocation_info).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn allocation_info<T6>(
                self,
                value: T6,
            ) -> TensorBuilder<(T0, T1, T2, T3, T4, T5, T6)>
            where
                T6: ::planus::WriteAsOptional<::planus::Offset<self::AllocationDetails>>,
            {
                let (v0, v1, v2, v3, v4, v5) = self.0;
                TensorBuilder((v0, v1, v2, v3, v4, v5, value))
            }

            /// Sets the [`allocation_info` field](Tensor#structfield.allocation_info) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn allocation_info_as_null(self) -> TensorBuilder<(T0, T1, T2, T3, T4, T5, ())> {
                self.allocation_info(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6> TensorBuilder<(T0, T1, T2, T3, T4, T5, T6)> {
            /// Setter for the [`layout` field](Tensor#structfield.layout).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn layout<T7>(self, value: T7) -> TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
            where
                T7: ::planus::WriteAsDefault<i8, i8>,
            {
                let (v0, v1, v2, v3, v4, v5, v6) = self.0;
                TensorBuilder((v0, v1, v2, v3, v4, v5, v6, value))
            }

            /// Sets the [`layout` field](Tensor#structfield.layout) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn layout_as_default(
                self,
            ) -> TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, ::planus::DefaultValue)> {
                self.layout(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7> TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)> {
            /// Setter for the [`shape_dynamism` field](Tensor#structfield.shape_dynamism).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn shape_dynamism<T8>(
                self,
                value: T8,
            ) -> TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
            where
                T8: ::planus::WriteAsDefault<self::TensorShapeDynamism, self::TensorShapeDynamism>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7) = self.0;
                TensorBuilder((v0, v1, v2, v3, v4, v5, v6, v7, value))
            }

            /// Sets the [`shape_dynamism` field](Tensor#structfield.shape_dynamism) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn shape_dynamism_as_default(
                self,
            ) -> TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, ::planus::DefaultValue)>
            {
                self.shape_dynamism(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8> TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)> {
            /// Setter for the [`extra_tensor_info` field](Tensor#structfield.extra_tensor_info).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn extra_tensor_info<T9>(
                self,
                value: T9,
            ) -> TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
            where
                T9: ::planus::WriteAsOptional<::planus::Offset<self::ExtraTensorInfo>>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8) = self.0;
                TensorBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, value))
            }

            /// Sets the [`extra_tensor_info` field](Tensor#structfield.extra_tensor_info) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn extra_tensor_info_as_null(
                self,
            ) -> TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, ())> {
                self.extra_tensor_info(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9>
            TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Tensor].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Tensor>
            where
                Self: ::planus::WriteAsOffset<Tensor>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<self::ScalarType, self::ScalarType>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
                T4: ::planus::WriteAsDefault<bool, bool>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsOptional<::planus::Offset<self::AllocationDetails>>,
                T7: ::planus::WriteAsDefault<i8, i8>,
                T8: ::planus::WriteAsDefault<self::TensorShapeDynamism, self::TensorShapeDynamism>,
                T9: ::planus::WriteAsOptional<::planus::Offset<self::ExtraTensorInfo>>,
            > ::planus::WriteAs<::planus::Offset<Tensor>>
            for TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            type Prepared = ::planus::Offset<Tensor>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Tensor> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<self::ScalarType, self::ScalarType>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
                T4: ::planus::WriteAsDefault<bool, bool>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsOptional<::planus::Offset<self::AllocationDetails>>,
                T7: ::planus::WriteAsDefault<i8, i8>,
                T8: ::planus::WriteAsDefault<self::TensorShapeDynamism, self::TensorShapeDynamism>,
                T9: ::planus::WriteAsOptional<::planus::Offset<self::ExtraTensorInfo>>,
            > ::planus::WriteAsOptional<::planus::Offset<Tensor>>
            for TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            type Prepared = ::planus::Offset<Tensor>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Tensor>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<self::ScalarType, self::ScalarType>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
                T4: ::planus::WriteAsDefault<bool, bool>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsOptional<::planus::Offset<self::AllocationDetails>>,
                T7: ::planus::WriteAsDefault<i8, i8>,
                T8: ::planus::WriteAsDefault<self::TensorShapeDynamism, self::TensorShapeDynamism>,
                T9: ::planus::WriteAsOptional<::planus::Offset<self::ExtraTensorInfo>>,
            > ::planus::WriteAsOffset<Tensor>
            for TensorBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Tensor> {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9) = &self.0;
                Tensor::create(builder, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9)
            }
        }

        /// Reference to a deserialized [Tensor].
        #[derive(Copy, Clone)]
        pub struct TensorRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> TensorRef<'a> {
            /// Getter for the [`scalar_type` field](Tensor#structfield.scalar_type).
            #[inline]
            pub fn scalar_type(&self) -> ::planus::Result<self::ScalarType> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "Tensor", "scalar_type")?
                        .unwrap_or(self::ScalarType::Byte),
                )
            }

            /// Getter for the [`storage_offset` field](Tensor#structfield.storage_offset).
            #[inline]
            pub fn storage_offset(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0.access(1, "Tensor", "storage_offset")?.unwrap_or(0),
                )
            }

            /// Getter for the [`sizes` field](Tensor#structfield.sizes).
            #[inline]
            pub fn sizes(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(2, "Tensor", "sizes")
            }

            /// Getter for the [`dim_order` field](Tensor#structfield.dim_order).
            #[inline]
            pub fn dim_order(&self) -> ::planus::Result<::core::option::Option<&'a [u8]>> {
                self.0.access(3, "Tensor", "dim_order")
            }

            /// Getter for the [`requires_grad` field](Tensor#structfield.requires_grad).
            #[inline]
            pub fn requires_grad(&self) -> ::planus::Result<bool> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "Tensor", "requires_grad")?
                        .unwrap_or(false),
                )
            }

            /// Getter for the [`data_buffer_idx` field](Tensor#structfield.data_buffer_idx).
            #[inline]
            pub fn data_buffer_idx(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(5, "Tensor", "data_buffer_idx")?.unwrap_or(0),
                )
            }

            /// Getter for the [`allocation_info` field](Tensor#structfield.allocation_info).
            #[inline]
            pub fn allocation_info(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::AllocationDetailsRef<'a>>>
            {
                self.0.access(6, "Tensor", "allocation_info")
            }

            /// Getter for the [`layout` field](Tensor#structfield.layout).
            #[inline]
            pub fn layout(&self) -> ::planus::Result<i8> {
                ::core::result::Result::Ok(self.0.access(7, "Tensor", "layout")?.unwrap_or(0))
            }

            /// Getter for the [`shape_dynamism` field](Tensor#structfield.shape_dynamism).
            #[inline]
            pub fn shape_dynamism(&self) -> ::planus::Result<self::TensorShapeDynamism> {
                ::core::result::Result::Ok(
                    self.0
                        .access(8, "Tensor", "shape_dynamism")?
                        .unwrap_or(self::TensorShapeDynamism::Static),
                )
            }

            /// Getter for the [`extra_tensor_info` field](Tensor#structfield.extra_tensor_info).
            #[inline]
            pub fn extra_tensor_info(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::ExtraTensorInfoRef<'a>>>
            {
                self.0.access(9, "Tensor", "extra_tensor_info")
            }
        }

        impl<'a> ::core::fmt::Debug for TensorRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("TensorRef");
                f.field("scalar_type", &self.scalar_type());
                f.field("storage_offset", &self.storage_offset());
                if let ::core::option::Option::Some(field_sizes) = self.sizes().transpose() {
                    f.field("sizes", &field_sizes);
                }
                if let ::core::option::Option::Some(field_dim_order) = self.dim_order().transpose()
                {
                    f.field("dim_order", &field_dim_order);
                }
                f.field("requires_grad", &self.requires_grad());
                f.field("data_buffer_idx", &self.data_buffer_idx());
                if let ::core::option::Option::Some(field_allocation_info) =
                    self.allocation_info().transpose()
                {
                    f.field("allocation_info", &field_allocation_info);
                }
                f.field("layout", &self.layout());
                f.field("shape_dynamism", &self.shape_dynamism());
                if let ::core::option::Option::Some(field_extra_tensor_info) =
                    self.extra_tensor_info().transpose()
                {
                    f.field("extra_tensor_info", &field_extra_tensor_info);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<TensorRef<'a>> for Tensor {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: TensorRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    scalar_type: ::core::convert::TryInto::try_into(value.scalar_type()?)?,
                    storage_offset: ::core::convert::TryInto::try_into(value.storage_offset()?)?,
                    sizes: if let ::core::option::Option::Some(sizes) = value.sizes()? {
                        ::core::option::Option::Some(sizes.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    dim_order: value.dim_order()?.map(|v| v.to_vec()),
                    requires_grad: ::core::convert::TryInto::try_into(value.requires_grad()?)?,
                    data_buffer_idx: ::core::convert::TryInto::try_into(value.data_buffer_idx()?)?,
                    allocation_info: if let ::core::option::Option::Some(allocation_info) =
                        value.allocation_info()?
                    {
                        ::core::option::Option::Some(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryInto::try_into(allocation_info)?,
                        ))
                    } else {
                        ::core::option::Option::None
                    },
                    layout: ::core::convert::TryInto::try_into(value.layout()?)?,
                    shape_dynamism: ::core::convert::TryInto::try_into(value.shape_dynamism()?)?,
                    extra_tensor_info: if let ::core::option::Option::Some(extra_tensor_info) =
                        value.extra_tensor_info()?
                    {
                        ::core::option::Option::Some(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryInto::try_into(extra_tensor_info)?,
                        ))
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for TensorRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for TensorRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[TensorRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Tensor>> for Tensor {
            type Value = ::planus::Offset<Tensor>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Tensor>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for TensorRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[TensorRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Int` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Int` in the file `schema/program.fbs:66`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Int {
            /// The field `int_val` in the table `Int`
            pub int_val: i64,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Int {
            fn default() -> Self {
                Self { int_val: 0 }
            }
        }

        impl Int {
            /// Creates a [IntBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> IntBuilder<()> {
                IntBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_int_val: impl ::planus::WriteAsDefault<i64, i64>,
            ) -> ::planus::Offset<Self> {
                let prepared_int_val = field_int_val.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_int_val.is_some() {
                    table_writer.write_entry::<i64>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_int_val) = prepared_int_val {
                            object_writer.write::<_, _, 8>(&prepared_int_val);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Int>> for Int {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Int> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Int>> for Int {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Int>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Int> for Int {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Int> {
                Int::create(builder, self.int_val)
            }
        }

        /// Builder for serializing an instance of the [Int] type.
        ///
        /// Can be created using the [Int::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct IntBuilder<State>(State);

        impl IntBuilder<()> {
            /// Setter for the [`int_val` field](Int#structfield.int_val).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn int_val<T0>(self, value: T0) -> IntBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<i64, i64>,
            {
                IntBuilder((value,))
            }

            /// Sets the [`int_val` field](Int#structfield.int_val) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn int_val_as_default(self) -> IntBuilder<(::planus::DefaultValue,)> {
                self.int_val(::planus::DefaultValue)
            }
        }

        impl<T0> IntBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Int].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Int>
            where
                Self: ::planus::WriteAsOffset<Int>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i64, i64>> ::planus::WriteAs<::planus::Offset<Int>>
            for IntBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Int>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Int> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i64, i64>>
            ::planus::WriteAsOptional<::planus::Offset<Int>> for IntBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Int>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Int>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<i64, i64>> ::planus::WriteAsOffset<Int> for IntBuilder<(T0,)> {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Int> {
                let (v0,) = &self.0;
                Int::create(builder, v0)
            }
        }

        /// Reference to a deserialized [Int].
        #[derive(Copy, Clone)]
        pub struct IntRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> IntRef<'a> {
            /// Getter for the [`int_val` field](Int#structfield.int_val).
            #[inline]
            pub fn int_val(&self) -> ::planus::Result<i64> {
                ::core::result::Result::Ok(self.0.access(0, "Int", "int_val")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for IntRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("IntRef");
                f.field("int_val", &self.int_val());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<IntRef<'a>> for Int {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: IntRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    int_val: ::core::convert::TryInto::try_into(value.int_val()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for IntRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for IntRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[IntRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Int>> for Int {
            type Value = ::planus::Offset<Int>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Int>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for IntRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| error_kind.with_error_location("[IntRef]", "read_as_root", 0))
            }
        }

        /// The table `Bool` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Bool` in the file `schema/program.fbs:70`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Bool {
            /// The field `bool_val` in the table `Bool`
            pub bool_val: bool,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Bool {
            fn default() -> Self {
                Self { bool_val: false }
            }
        }

        impl Bool {
            /// Creates a [BoolBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> BoolBuilder<()> {
                BoolBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_bool_val: impl ::planus::WriteAsDefault<bool, bool>,
            ) -> ::planus::Offset<Self> {
                let prepared_bool_val = field_bool_val.prepare(builder, &false);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_bool_val.is_some() {
                    table_writer.write_entry::<bool>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_bool_val) = prepared_bool_val {
                            object_writer.write::<_, _, 1>(&prepared_bool_val);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Bool>> for Bool {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Bool> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Bool>> for Bool {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Bool>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Bool> for Bool {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Bool> {
                Bool::create(builder, self.bool_val)
            }
        }

        /// Builder for serializing an instance of the [Bool] type.
        ///
        /// Can be created using the [Bool::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct BoolBuilder<State>(State);

        impl BoolBuilder<()> {
            /// Setter for the [`bool_val` field](Bool#structfield.bool_val).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn bool_val<T0>(self, value: T0) -> BoolBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<bool, bool>,
            {
                BoolBuilder((value,))
            }

            /// Sets the [`bool_val` field](Bool#structfield.bool_val) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn bool_val_as_default(self) -> BoolBuilder<(::planus::DefaultValue,)> {
                self.bool_val(::planus::DefaultValue)
            }
        }

        impl<T0> BoolBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Bool].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Bool>
            where
                Self: ::planus::WriteAsOffset<Bool>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<bool, bool>> ::planus::WriteAs<::planus::Offset<Bool>>
            for BoolBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Bool>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Bool> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<bool, bool>>
            ::planus::WriteAsOptional<::planus::Offset<Bool>> for BoolBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Bool>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Bool>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<bool, bool>> ::planus::WriteAsOffset<Bool>
            for BoolBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Bool> {
                let (v0,) = &self.0;
                Bool::create(builder, v0)
            }
        }

        /// Reference to a deserialized [Bool].
        #[derive(Copy, Clone)]
        pub struct BoolRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> BoolRef<'a> {
            /// Getter for the [`bool_val` field](Bool#structfield.bool_val).
            #[inline]
            pub fn bool_val(&self) -> ::planus::Result<bool> {
                ::core::result::Result::Ok(self.0.access(0, "Bool", "bool_val")?.unwrap_or(false))
            }
        }

        impl<'a> ::core::fmt::Debug for BoolRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("BoolRef");
                f.field("bool_val", &self.bool_val());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<BoolRef<'a>> for Bool {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: BoolRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    bool_val: ::core::convert::TryInto::try_into(value.bool_val()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for BoolRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for BoolRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[BoolRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Bool>> for Bool {
            type Value = ::planus::Offset<Bool>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Bool>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for BoolRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[BoolRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Double` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Double` in the file `schema/program.fbs:74`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct Double {
            /// The field `double_val` in the table `Double`
            pub double_val: f64,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Double {
            fn default() -> Self {
                Self { double_val: 0.0 }
            }
        }

        impl Double {
            /// Creates a [DoubleBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> DoubleBuilder<()> {
                DoubleBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_double_val: impl ::planus::WriteAsDefault<f64, f64>,
            ) -> ::planus::Offset<Self> {
                let prepared_double_val = field_double_val.prepare(builder, &0.0);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_double_val.is_some() {
                    table_writer.write_entry::<f64>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_double_val) =
                            prepared_double_val
                        {
                            object_writer.write::<_, _, 8>(&prepared_double_val);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Double>> for Double {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Double> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Double>> for Double {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Double>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Double> for Double {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Double> {
                Double::create(builder, self.double_val)
            }
        }

        /// Builder for serializing an instance of the [Double] type.
        ///
        /// Can be created using the [Double::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct DoubleBuilder<State>(State);

        impl DoubleBuilder<()> {
            /// Setter for the [`double_val` field](Double#structfield.double_val).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn double_val<T0>(self, value: T0) -> DoubleBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<f64, f64>,
            {
                DoubleBuilder((value,))
            }

            /// Sets the [`double_val` field](Double#structfield.double_val) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn double_val_as_default(self) -> DoubleBuilder<(::planus::DefaultValue,)> {
                self.double_val(::planus::DefaultValue)
            }
        }

        impl<T0> DoubleBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Double].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Double>
            where
                Self: ::planus::WriteAsOffset<Double>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<f64, f64>> ::planus::WriteAs<::planus::Offset<Double>>
            for DoubleBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Double>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Double> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<f64, f64>>
            ::planus::WriteAsOptional<::planus::Offset<Double>> for DoubleBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Double>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Double>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<f64, f64>> ::planus::WriteAsOffset<Double>
            for DoubleBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Double> {
                let (v0,) = &self.0;
                Double::create(builder, v0)
            }
        }

        /// Reference to a deserialized [Double].
        #[derive(Copy, Clone)]
        pub struct DoubleRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> DoubleRef<'a> {
            /// Getter for the [`double_val` field](Double#structfield.double_val).
            #[inline]
            pub fn double_val(&self) -> ::planus::Result<f64> {
                ::core::result::Result::Ok(self.0.access(0, "Double", "double_val")?.unwrap_or(0.0))
            }
        }

        impl<'a> ::core::fmt::Debug for DoubleRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("DoubleRef");
                f.field("double_val", &self.double_val());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<DoubleRef<'a>> for Double {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: DoubleRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    double_val: ::core::convert::TryInto::try_into(value.double_val()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for DoubleRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for DoubleRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[DoubleRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Double>> for Double {
            type Value = ::planus::Offset<Double>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Double>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for DoubleRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[DoubleRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `String` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `String` in the file `schema/program.fbs:78`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct String {
            /// The field `string_val` in the table `String`
            pub string_val: ::core::option::Option<::planus::alloc::string::String>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for String {
            fn default() -> Self {
                Self {
                    string_val: ::core::default::Default::default(),
                }
            }
        }

        impl String {
            /// Creates a [StringBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> StringBuilder<()> {
                StringBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_string_val: impl ::planus::WriteAsOptional<
                    ::planus::Offset<::core::primitive::str>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_string_val = field_string_val.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_string_val.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_string_val) =
                            prepared_string_val
                        {
                            object_writer.write::<_, _, 4>(&prepared_string_val);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<String>> for String {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<String> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<String>> for String {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<String>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<String> for String {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<String> {
                String::create(builder, &self.string_val)
            }
        }

        /// Builder for serializing an instance of the [String] type.
        ///
        /// Can be created using the [String::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct StringBuilder<State>(State);

        impl StringBuilder<()> {
            /// Setter for the [`string_val` field](String#structfield.string_val).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn string_val<T0>(self, value: T0) -> StringBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                StringBuilder((value,))
            }

            /// Sets the [`string_val` field](String#structfield.string_val) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn string_val_as_null(self) -> StringBuilder<((),)> {
                self.string_val(())
            }
        }

        impl<T0> StringBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [String].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<String>
            where
                Self: ::planus::WriteAsOffset<String>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>>
            ::planus::WriteAs<::planus::Offset<String>> for StringBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<String>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<String> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>>
            ::planus::WriteAsOptional<::planus::Offset<String>> for StringBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<String>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<String>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>>
            ::planus::WriteAsOffset<String> for StringBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<String> {
                let (v0,) = &self.0;
                String::create(builder, v0)
            }
        }

        /// Reference to a deserialized [String].
        #[derive(Copy, Clone)]
        pub struct StringRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> StringRef<'a> {
            /// Getter for the [`string_val` field](String#structfield.string_val).
            #[inline]
            pub fn string_val(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "String", "string_val")
            }
        }

        impl<'a> ::core::fmt::Debug for StringRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("StringRef");
                if let ::core::option::Option::Some(field_string_val) =
                    self.string_val().transpose()
                {
                    f.field("string_val", &field_string_val);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<StringRef<'a>> for String {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: StringRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    string_val: value.string_val()?.map(::core::convert::Into::into),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for StringRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for StringRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[StringRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<String>> for String {
            type Value = ::planus::Offset<String>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<String>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for StringRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[StringRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `IntList` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `IntList` in the file `schema/program.fbs:83`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct IntList {
            /// The field `items` in the table `IntList`
            pub items: ::core::option::Option<::planus::alloc::vec::Vec<i64>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for IntList {
            fn default() -> Self {
                Self {
                    items: ::core::default::Default::default(),
                }
            }
        }

        impl IntList {
            /// Creates a [IntListBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> IntListBuilder<()> {
                IntListBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_items: impl ::planus::WriteAsOptional<::planus::Offset<[i64]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_items = field_items.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_items.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i64]>>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_items) = prepared_items {
                            object_writer.write::<_, _, 4>(&prepared_items);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<IntList>> for IntList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<IntList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<IntList>> for IntList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<IntList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<IntList> for IntList {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<IntList> {
                IntList::create(builder, &self.items)
            }
        }

        /// Builder for serializing an instance of the [IntList] type.
        ///
        /// Can be created using the [IntList::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct IntListBuilder<State>(State);

        impl IntListBuilder<()> {
            /// Setter for the [`items` field](IntList#structfield.items).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items<T0>(self, value: T0) -> IntListBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[i64]>>,
            {
                IntListBuilder((value,))
            }

            /// Sets the [`items` field](IntList#structfield.items) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items_as_null(self) -> IntListBuilder<((),)> {
                self.items(())
            }
        }

        impl<T0> IntListBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [IntList].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<IntList>
            where
                Self: ::planus::WriteAsOffset<IntList>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[i64]>>>
            ::planus::WriteAs<::planus::Offset<IntList>> for IntListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<IntList>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<IntList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[i64]>>>
            ::planus::WriteAsOptional<::planus::Offset<IntList>> for IntListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<IntList>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<IntList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[i64]>>>
            ::planus::WriteAsOffset<IntList> for IntListBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<IntList> {
                let (v0,) = &self.0;
                IntList::create(builder, v0)
            }
        }

        /// Reference to a deserialized [IntList].
        #[derive(Copy, Clone)]
        pub struct IntListRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> IntListRef<'a> {
            /// Getter for the [`items` field](IntList#structfield.items).
            #[inline]
            pub fn items(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i64>>> {
                self.0.access(0, "IntList", "items")
            }
        }

        impl<'a> ::core::fmt::Debug for IntListRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("IntListRef");
                if let ::core::option::Option::Some(field_items) = self.items().transpose() {
                    f.field("items", &field_items);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<IntListRef<'a>> for IntList {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: IntListRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    items: if let ::core::option::Option::Some(items) = value.items()? {
                        ::core::option::Option::Some(items.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for IntListRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for IntListRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[IntListRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<IntList>> for IntList {
            type Value = ::planus::Offset<IntList>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<IntList>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for IntListRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[IntListRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `DoubleList` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `DoubleList` in the file `schema/program.fbs:87`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct DoubleList {
            /// The field `items` in the table `DoubleList`
            pub items: ::core::option::Option<::planus::alloc::vec::Vec<f64>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for DoubleList {
            fn default() -> Self {
                Self {
                    items: ::core::default::Default::default(),
                }
            }
        }

        impl DoubleList {
            /// Creates a [DoubleListBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> DoubleListBuilder<()> {
                DoubleListBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_items: impl ::planus::WriteAsOptional<::planus::Offset<[f64]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_items = field_items.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_items.is_some() {
                    table_writer.write_entry::<::planus::Offset<[f64]>>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_items) = prepared_items {
                            object_writer.write::<_, _, 4>(&prepared_items);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<DoubleList>> for DoubleList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DoubleList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<DoubleList>> for DoubleList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<DoubleList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<DoubleList> for DoubleList {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DoubleList> {
                DoubleList::create(builder, &self.items)
            }
        }

        /// Builder for serializing an instance of the [DoubleList] type.
        ///
        /// Can be created using the [DoubleList::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct DoubleListBuilder<State>(State);

        impl DoubleListBuilder<()> {
            /// Setter for the [`items` field](DoubleList#structfield.items).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items<T0>(self, value: T0) -> DoubleListBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[f64]>>,
            {
                DoubleListBuilder((value,))
            }

            /// Sets the [`items` field](DoubleList#structfield.items) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items_as_null(self) -> DoubleListBuilder<((),)> {
                self.items(())
            }
        }

        impl<T0> DoubleListBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [DoubleList].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<DoubleList>
            where
                Self: ::planus::WriteAsOffset<DoubleList>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[f64]>>>
            ::planus::WriteAs<::planus::Offset<DoubleList>> for DoubleListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<DoubleList>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DoubleList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[f64]>>>
            ::planus::WriteAsOptional<::planus::Offset<DoubleList>> for DoubleListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<DoubleList>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<DoubleList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[f64]>>>
            ::planus::WriteAsOffset<DoubleList> for DoubleListBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DoubleList> {
                let (v0,) = &self.0;
                DoubleList::create(builder, v0)
            }
        }

        /// Reference to a deserialized [DoubleList].
        #[derive(Copy, Clone)]
        pub struct DoubleListRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> DoubleListRef<'a> {
            /// Getter for the [`items` field](DoubleList#structfield.items).
            #[inline]
            pub fn items(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, f64>>> {
                self.0.access(0, "DoubleList", "items")
            }
        }

        impl<'a> ::core::fmt::Debug for DoubleListRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("DoubleListRef");
                if let ::core::option::Option::Some(field_items) = self.items().transpose() {
                    f.field("items", &field_items);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<DoubleListRef<'a>> for DoubleList {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: DoubleListRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    items: if let ::core::option::Option::Some(items) = value.items()? {
                        ::core::option::Option::Some(items.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for DoubleListRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for DoubleListRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[DoubleListRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<DoubleList>> for DoubleList {
            type Value = ::planus::Offset<DoubleList>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<DoubleList>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for DoubleListRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[DoubleListRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `BoolList` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `BoolList` in the file `schema/program.fbs:91`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct BoolList {
            /// The field `items` in the table `BoolList`
            pub items: ::core::option::Option<::planus::alloc::vec::Vec<bool>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for BoolList {
            fn default() -> Self {
                Self {
                    items: ::core::default::Default::default(),
                }
            }
        }

        impl BoolList {
            /// Creates a [BoolListBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> BoolListBuilder<()> {
                BoolListBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_items: impl ::planus::WriteAsOptional<::planus::Offset<[bool]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_items = field_items.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_items.is_some() {
                    table_writer.write_entry::<::planus::Offset<[bool]>>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_items) = prepared_items {
                            object_writer.write::<_, _, 4>(&prepared_items);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<BoolList>> for BoolList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<BoolList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<BoolList>> for BoolList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BoolList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<BoolList> for BoolList {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<BoolList> {
                BoolList::create(builder, &self.items)
            }
        }

        /// Builder for serializing an instance of the [BoolList] type.
        ///
        /// Can be created using the [BoolList::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct BoolListBuilder<State>(State);

        impl BoolListBuilder<()> {
            /// Setter for the [`items` field](BoolList#structfield.items).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items<T0>(self, value: T0) -> BoolListBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[bool]>>,
            {
                BoolListBuilder((value,))
            }

            /// Sets the [`items` field](BoolList#structfield.items) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items_as_null(self) -> BoolListBuilder<((),)> {
                self.items(())
            }
        }

        impl<T0> BoolListBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [BoolList].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<BoolList>
            where
                Self: ::planus::WriteAsOffset<BoolList>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[bool]>>>
            ::planus::WriteAs<::planus::Offset<BoolList>> for BoolListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<BoolList>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<BoolList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[bool]>>>
            ::planus::WriteAsOptional<::planus::Offset<BoolList>> for BoolListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<BoolList>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BoolList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[bool]>>>
            ::planus::WriteAsOffset<BoolList> for BoolListBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<BoolList> {
                let (v0,) = &self.0;
                BoolList::create(builder, v0)
            }
        }

        /// Reference to a deserialized [BoolList].
        #[derive(Copy, Clone)]
        pub struct BoolListRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> BoolListRef<'a> {
            /// Getter for the [`items` field](BoolList#structfield.items).
            #[inline]
            pub fn items(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, bool>>> {
                self.0.access(0, "BoolList", "items")
            }
        }

        impl<'a> ::core::fmt::Debug for BoolListRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("BoolListRef");
                if let ::core::option::Option::Some(field_items) = self.items().transpose() {
                    f.field("items", &field_items);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<BoolListRef<'a>> for BoolList {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: BoolListRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    items: if let ::core::option::Option::Some(items) = value.items()? {
                        ::core::option::Option::Some(items.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for BoolListRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for BoolListRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[BoolListRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<BoolList>> for BoolList {
            type Value = ::planus::Offset<BoolList>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<BoolList>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for BoolListRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[BoolListRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `TensorList` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `TensorList` in the file `schema/program.fbs:96`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct TensorList {
            /// The field `items` in the table `TensorList`
            pub items: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for TensorList {
            fn default() -> Self {
                Self {
                    items: ::core::default::Default::default(),
                }
            }
        }

        impl TensorList {
            /// Creates a [TensorListBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> TensorListBuilder<()> {
                TensorListBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_items: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_items = field_items.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_items.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_items) = prepared_items {
                            object_writer.write::<_, _, 4>(&prepared_items);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<TensorList>> for TensorList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<TensorList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<TensorList>> for TensorList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<TensorList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<TensorList> for TensorList {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<TensorList> {
                TensorList::create(builder, &self.items)
            }
        }

        /// Builder for serializing an instance of the [TensorList] type.
        ///
        /// Can be created using the [TensorList::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct TensorListBuilder<State>(State);

        impl TensorListBuilder<()> {
            /// Setter for the [`items` field](TensorList#structfield.items).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items<T0>(self, value: T0) -> TensorListBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                TensorListBuilder((value,))
            }

            /// Sets the [`items` field](TensorList#structfield.items) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items_as_null(self) -> TensorListBuilder<((),)> {
                self.items(())
            }
        }

        impl<T0> TensorListBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [TensorList].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<TensorList>
            where
                Self: ::planus::WriteAsOffset<TensorList>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>>
            ::planus::WriteAs<::planus::Offset<TensorList>> for TensorListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<TensorList>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<TensorList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>>
            ::planus::WriteAsOptional<::planus::Offset<TensorList>> for TensorListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<TensorList>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<TensorList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>>
            ::planus::WriteAsOffset<TensorList> for TensorListBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<TensorList> {
                let (v0,) = &self.0;
                TensorList::create(builder, v0)
            }
        }

        /// Reference to a deserialized [TensorList].
        #[derive(Copy, Clone)]
        pub struct TensorListRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> TensorListRef<'a> {
            /// Getter for the [`items` field](TensorList#structfield.items).
            #[inline]
            pub fn items(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(0, "TensorList", "items")
            }
        }

        impl<'a> ::core::fmt::Debug for TensorListRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("TensorListRef");
                if let ::core::option::Option::Some(field_items) = self.items().transpose() {
                    f.field("items", &field_items);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<TensorListRef<'a>> for TensorList {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: TensorListRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    items: if let ::core::option::Option::Some(items) = value.items()? {
                        ::core::option::Option::Some(items.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for TensorListRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for TensorListRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[TensorListRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<TensorList>> for TensorList {
            type Value = ::planus::Offset<TensorList>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<TensorList>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for TensorListRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[TensorListRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `OptionalTensorList` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `OptionalTensorList` in the file `schema/program.fbs:101`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct OptionalTensorList {
            /// The field `items` in the table `OptionalTensorList`
            pub items: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for OptionalTensorList {
            fn default() -> Self {
                Self {
                    items: ::core::default::Default::default(),
                }
            }
        }

        impl OptionalTensorList {
            /// Creates a [OptionalTensorListBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> OptionalTensorListBuilder<()> {
                OptionalTensorListBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_items: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_items = field_items.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_items.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_items) = prepared_items {
                            object_writer.write::<_, _, 4>(&prepared_items);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<OptionalTensorList>> for OptionalTensorList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<OptionalTensorList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<OptionalTensorList>> for OptionalTensorList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<OptionalTensorList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<OptionalTensorList> for OptionalTensorList {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<OptionalTensorList> {
                OptionalTensorList::create(builder, &self.items)
            }
        }

        /// Builder for serializing an instance of the [OptionalTensorList] type.
        ///
        /// Can be created using the [OptionalTensorList::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct OptionalTensorListBuilder<State>(State);

        impl OptionalTensorListBuilder<()> {
            /// Setter for the [`items` field](OptionalTensorList#structfield.items).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items<T0>(self, value: T0) -> OptionalTensorListBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                OptionalTensorListBuilder((value,))
            }

            /// Sets the [`items` field](OptionalTensorList#structfield.items) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items_as_null(self) -> OptionalTensorListBuilder<((),)> {
                self.items(())
            }
        }

        impl<T0> OptionalTensorListBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [OptionalTensorList].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<OptionalTensorList>
            where
                Self: ::planus::WriteAsOffset<OptionalTensorList>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>>
            ::planus::WriteAs<::planus::Offset<OptionalTensorList>>
            for OptionalTensorListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<OptionalTensorList>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<OptionalTensorList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>>
            ::planus::WriteAsOptional<::planus::Offset<OptionalTensorList>>
            for OptionalTensorListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<OptionalTensorList>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<OptionalTensorList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>>
            ::planus::WriteAsOffset<OptionalTensorList> for OptionalTensorListBuilder<(T0,)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<OptionalTensorList> {
                let (v0,) = &self.0;
                OptionalTensorList::create(builder, v0)
            }
        }

        /// Reference to a deserialized [OptionalTensorList].
        #[derive(Copy, Clone)]
        pub struct OptionalTensorListRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> OptionalTensorListRef<'a> {
            /// Getter for the [`items` field](OptionalTensorList#structfield.items).
            #[inline]
            pub fn items(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(0, "OptionalTensorList", "items")
            }
        }

        impl<'a> ::core::fmt::Debug for OptionalTensorListRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("OptionalTensorListRef");
                if let ::core::option::Option::Some(field_items) = self.items().transpose() {
                    f.field("items", &field_items);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<OptionalTensorListRef<'a>> for OptionalTensorList {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: OptionalTensorListRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    items: if let ::core::option::Option::Some(items) = value.items()? {
                        ::core::option::Option::Some(items.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for OptionalTensorListRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for OptionalTensorListRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[OptionalTensorListRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<OptionalTensorList>> for OptionalTensorList {
            type Value = ::planus::Offset<OptionalTensorList>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<OptionalTensorList>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for OptionalTensorListRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[OptionalTensorListRef]", "read_as_root", 0)
                })
            }
        }

        /// The union `KernelTypes` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Union `KernelTypes` in the file `schema/program.fbs:105`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub enum KernelTypes {
            /// The variant of type `Null` in the union `KernelTypes`
            Null(::planus::alloc::boxed::Box<self::Null>),

            /// The variant of type `Int` in the union `KernelTypes`
            Int(::planus::alloc::boxed::Box<self::Int>),

            /// The variant of type `Bool` in the union `KernelTypes`
            Bool(::planus::alloc::boxed::Box<self::Bool>),

            /// The variant of type `Double` in the union `KernelTypes`
            Double(::planus::alloc::boxed::Box<self::Double>),

            /// The variant of type `Tensor` in the union `KernelTypes`
            Tensor(::planus::alloc::boxed::Box<self::Tensor>),

            /// The variant of type `String` in the union `KernelTypes`
            String(::planus::alloc::boxed::Box<self::String>),

            /// The variant of type `IntList` in the union `KernelTypes`
            IntList(::planus::alloc::boxed::Box<self::IntList>),

            /// The variant of type `DoubleList` in the union `KernelTypes`
            DoubleList(::planus::alloc::boxed::Box<self::DoubleList>),

            /// The variant of type `BoolList` in the union `KernelTypes`
            BoolList(::planus::alloc::boxed::Box<self::BoolList>),

            /// The variant of type `TensorList` in the union `KernelTypes`
            TensorList(::planus::alloc::boxed::Box<self::TensorList>),

            /// The variant of type `OptionalTensorList` in the union `KernelTypes`
            OptionalTensorList(::planus::alloc::boxed::Box<self::OptionalTensorList>),
        }

        impl KernelTypes {
            /// Creates a [KernelTypesBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> KernelTypesBuilder<::planus::Uninitialized> {
                KernelTypesBuilder(::planus::Uninitialized)
            }

            #[inline]
            pub fn create_null(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::Null>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(1, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_int(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::Int>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(2, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_bool(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::Bool>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(3, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_double(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::Double>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(4, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_tensor(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::Tensor>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(5, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_string(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::String>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(6, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_int_list(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::IntList>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(7, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_double_list(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::DoubleList>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(8, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_bool_list(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::BoolList>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(9, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_tensor_list(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::TensorList>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(10, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_optional_tensor_list(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::OptionalTensorList>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(11, value.prepare(builder).downcast())
            }
        }

        impl ::planus::WriteAsUnion<KernelTypes> for KernelTypes {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::UnionOffset<Self> {
                match self {
                    Self::Null(value) => Self::create_null(builder, value),
                    Self::Int(value) => Self::create_int(builder, value),
                    Self::Bool(value) => Self::create_bool(builder, value),
                    Self::Double(value) => Self::create_double(builder, value),
                    Self::Tensor(value) => Self::create_tensor(builder, value),
                    Self::String(value) => Self::create_string(builder, value),
                    Self::IntList(value) => Self::create_int_list(builder, value),
                    Self::DoubleList(value) => Self::create_double_list(builder, value),
                    Self::BoolList(value) => Self::create_bool_list(builder, value),
                    Self::TensorList(value) => Self::create_tensor_list(builder, value),
                    Self::OptionalTensorList(value) => {
                        Self::create_optional_tensor_list(builder, value)
                    }
                }
            }
        }

        impl ::planus::WriteAsOptionalUnion<KernelTypes> for KernelTypes {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<Self>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Builder for serializing an instance of the [KernelTypes] type.
        ///
        /// Can be created using the [KernelTypes::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct KernelTypesBuilder<T>(T);

        impl KernelTypesBuilder<::planus::Uninitialized> {
            /// Creates an instance of the [`Null` variant](KernelTypes#variant.Null).
            #[inline]
            pub fn null<T>(self, value: T) -> KernelTypesBuilder<::planus::Initialized<1, T>>
            where
                T: ::planus::WriteAsOffset<self::Null>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`Int` variant](KernelTypes#variant.Int).
            #[inline]
            pub fn int<T>(self, value: T) -> KernelTypesBuilder<::planus::Initialized<2, T>>
            where
                T: ::planus::WriteAsOffset<self::Int>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`Bool` variant](KernelTypes#variant.Bool).
            #[inline]
            pub fn bool<T>(self, value: T) -> KernelTypesBuilder<::planus::Initialized<3, T>>
            where
                T: ::planus::WriteAsOffset<self::Bool>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`Double` variant](KernelTypes#variant.Double).
            #[inline]
            pub fn double<T>(self, value: T) -> KernelTypesBuilder<::planus::Initialized<4, T>>
            where
                T: ::planus::WriteAsOffset<self::Double>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`Tensor` variant](KernelTypes#variant.Tensor).
            #[inline]
            pub fn tensor<T>(self, value: T) -> KernelTypesBuilder<::planus::Initialized<5, T>>
            where
                T: ::planus::WriteAsOffset<self::Tensor>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`String` variant](KernelTypes#variant.String).
            #[inline]
            pub fn string<T>(self, value: T) -> KernelTypesBuilder<::planus::Initialized<6, T>>
            where
                T: ::planus::WriteAsOffset<self::String>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`IntList` variant](KernelTypes#variant.IntList).
            #[inline]
            pub fn int_list<T>(self, value: T) -> KernelTypesBuilder<::planus::Initialized<7, T>>
            where
                T: ::planus::WriteAsOffset<self::IntList>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`DoubleList` variant](KernelTypes#variant.DoubleList).
            #[inline]
            pub fn double_list<T>(self, value: T) -> KernelTypesBuilder<::planus::Initialized<8, T>>
            where
                T: ::planus::WriteAsOffset<self::DoubleList>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`BoolList` variant](KernelTypes#variant.BoolList).
            #[inline]
            pub fn bool_list<T>(self, value: T) -> KernelTypesBuilder<::planus::Initialized<9, T>>
            where
                T: ::planus::WriteAsOffset<self::BoolList>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`TensorList` variant](KernelTypes#variant.TensorList).
            #[inline]
            pub fn tensor_list<T>(
                self,
                value: T,
            ) -> KernelTypesBuilder<::planus::Initialized<10, T>>
            where
                T: ::planus::WriteAsOffset<self::TensorList>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`OptionalTensorList` variant](KernelTypes#variant.OptionalTensorList).
            #[inline]
            pub fn optional_tensor_list<T>(
                self,
                value: T,
            ) -> KernelTypesBuilder<::planus::Initialized<11, T>>
            where
                T: ::planus::WriteAsOffset<self::OptionalTensorList>,
            {
                KernelTypesBuilder(::planus::Initialized(value))
            }
        }

        impl<const N: u8, T> KernelTypesBuilder<::planus::Initialized<N, T>> {
            /// Finish writing the builder to get an [UnionOffset](::planus::UnionOffset) to a serialized [KernelTypes].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes>
            where
                Self: ::planus::WriteAsUnion<KernelTypes>,
            {
                ::planus::WriteAsUnion::prepare(&self, builder)
            }
        }

        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::Null>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(1, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::Null>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::Int>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(2, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::Int>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<3, T>>
        where
            T: ::planus::WriteAsOffset<self::Bool>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(3, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<3, T>>
        where
            T: ::planus::WriteAsOffset<self::Bool>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<4, T>>
        where
            T: ::planus::WriteAsOffset<self::Double>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(4, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<4, T>>
        where
            T: ::planus::WriteAsOffset<self::Double>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<5, T>>
        where
            T: ::planus::WriteAsOffset<self::Tensor>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(5, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<5, T>>
        where
            T: ::planus::WriteAsOffset<self::Tensor>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<6, T>>
        where
            T: ::planus::WriteAsOffset<self::String>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(6, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<6, T>>
        where
            T: ::planus::WriteAsOffset<self::String>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<7, T>>
        where
            T: ::planus::WriteAsOffset<self::IntList>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(7, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<7, T>>
        where
            T: ::planus::WriteAsOffset<self::IntList>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<8, T>>
        where
            T: ::planus::WriteAsOffset<self::DoubleList>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(8, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<8, T>>
        where
            T: ::planus::WriteAsOffset<self::DoubleList>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<9, T>>
        where
            T: ::planus::WriteAsOffset<self::BoolList>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(9, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<9, T>>
        where
            T: ::planus::WriteAsOffset<self::BoolList>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<10, T>>
        where
            T: ::planus::WriteAsOffset<self::TensorList>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(10, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<10, T>>
        where
            T: ::planus::WriteAsOffset<self::TensorList>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<KernelTypes> for KernelTypesBuilder<::planus::Initialized<11, T>>
        where
            T: ::planus::WriteAsOffset<self::OptionalTensorList>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<KernelTypes> {
                ::planus::UnionOffset::new(11, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<KernelTypes>
            for KernelTypesBuilder<::planus::Initialized<11, T>>
        where
            T: ::planus::WriteAsOffset<self::OptionalTensorList>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<KernelTypes>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Reference to a deserialized [KernelTypes].
        #[derive(Copy, Clone, Debug)]
        pub enum KernelTypesRef<'a> {
            Null(self::NullRef<'a>),
            Int(self::IntRef<'a>),
            Bool(self::BoolRef<'a>),
            Double(self::DoubleRef<'a>),
            Tensor(self::TensorRef<'a>),
            String(self::StringRef<'a>),
            IntList(self::IntListRef<'a>),
            DoubleList(self::DoubleListRef<'a>),
            BoolList(self::BoolListRef<'a>),
            TensorList(self::TensorListRef<'a>),
            OptionalTensorList(self::OptionalTensorListRef<'a>),
        }

        impl<'a> ::core::convert::TryFrom<KernelTypesRef<'a>> for KernelTypes {
            type Error = ::planus::Error;

            fn try_from(value: KernelTypesRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(match value {
                    KernelTypesRef::Null(value) => Self::Null(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    KernelTypesRef::Int(value) => Self::Int(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    KernelTypesRef::Bool(value) => Self::Bool(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    KernelTypesRef::Double(value) => {
                        Self::Double(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    KernelTypesRef::Tensor(value) => {
                        Self::Tensor(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    KernelTypesRef::String(value) => {
                        Self::String(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    KernelTypesRef::IntList(value) => {
                        Self::IntList(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    KernelTypesRef::DoubleList(value) => {
                        Self::DoubleList(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    KernelTypesRef::BoolList(value) => {
                        Self::BoolList(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    KernelTypesRef::TensorList(value) => {
                        Self::TensorList(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    KernelTypesRef::OptionalTensorList(value) => {
                        Self::OptionalTensorList(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }
                })
            }
        }

        impl<'a> ::planus::TableReadUnion<'a> for KernelTypesRef<'a> {
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                tag: u8,
                field_offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                match tag {
                    1 => ::core::result::Result::Ok(Self::Null(::planus::TableRead::from_buffer(
                        buffer,
                        field_offset,
                    )?)),
                    2 => ::core::result::Result::Ok(Self::Int(::planus::TableRead::from_buffer(
                        buffer,
                        field_offset,
                    )?)),
                    3 => ::core::result::Result::Ok(Self::Bool(::planus::TableRead::from_buffer(
                        buffer,
                        field_offset,
                    )?)),
                    4 => ::core::result::Result::Ok(Self::Double(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    5 => ::core::result::Result::Ok(Self::Tensor(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    6 => ::core::result::Result::Ok(Self::String(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    7 => ::core::result::Result::Ok(Self::IntList(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    8 => ::core::result::Result::Ok(Self::DoubleList(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    9 => ::core::result::Result::Ok(Self::BoolList(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    10 => ::core::result::Result::Ok(Self::TensorList(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    11 => ::core::result::Result::Ok(Self::OptionalTensorList(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    _ => {
                        ::core::result::Result::Err(::planus::errors::ErrorKind::UnknownUnionTag {
                            tag,
                        })
                    }
                }
            }
        }

        impl<'a> ::planus::VectorReadUnion<'a> for KernelTypesRef<'a> {
            const VECTOR_NAME: &'static str = "[KernelTypesRef]";
        }

        /// The table `EValue` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `EValue` in the file `schema/program.fbs:119`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct EValue {
            /// The field `val` in the table `EValue`
            pub val: ::core::option::Option<self::KernelTypes>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for EValue {
            fn default() -> Self {
                Self {
                    val: ::core::default::Default::default(),
                }
            }
        }

        impl EValue {
            /// Creates a [EValueBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> EValueBuilder<()> {
                EValueBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_val: impl ::planus::WriteAsOptionalUnion<self::KernelTypes>,
            ) -> ::planus::Offset<Self> {
                let prepared_val = field_val.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_val.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::KernelTypes>>(1);
                }
                if prepared_val.is_some() {
                    table_writer.write_entry::<u8>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_val) = prepared_val {
                            object_writer.write::<_, _, 4>(&prepared_val.offset());
                        }
                        if let ::core::option::Option::Some(prepared_val) = prepared_val {
                            object_writer.write::<_, _, 1>(&prepared_val.tag());
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<EValue>> for EValue {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<EValue> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<EValue>> for EValue {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<EValue>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<EValue> for EValue {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<EValue> {
                EValue::create(builder, &self.val)
            }
        }

        /// Builder for serializing an instance of the [EValue] type.
        ///
        /// Can be created using the [EValue::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct EValueBuilder<State>(State);

        impl EValueBuilder<()> {
            /// Setter for the [`val` field](EValue#structfield.val).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn val<T0>(self, value: T0) -> EValueBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptionalUnion<self::KernelTypes>,
            {
                EValueBuilder((value,))
            }

            /// Sets the [`val` field](EValue#structfield.val) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn val_as_null(self) -> EValueBuilder<((),)> {
                self.val(())
            }
        }

        impl<T0> EValueBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [EValue].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<EValue>
            where
                Self: ::planus::WriteAsOffset<EValue>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::KernelTypes>>
            ::planus::WriteAs<::planus::Offset<EValue>> for EValueBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<EValue>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<EValue> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::KernelTypes>>
            ::planus::WriteAsOptional<::planus::Offset<EValue>> for EValueBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<EValue>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<EValue>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::KernelTypes>> ::planus::WriteAsOffset<EValue>
            for EValueBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<EValue> {
                let (v0,) = &self.0;
                EValue::create(builder, v0)
            }
        }

        /// Reference to a deserialized [EValue].
        #[derive(Copy, Clone)]
        pub struct EValueRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> EValueRef<'a> {
            /// Getter for the [`val` field](EValue#structfield.val).
            #[inline]
            pub fn val(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::KernelTypesRef<'a>>> {
                self.0.access_union(0, "EValue", "val")
            }
        }

        impl<'a> ::core::fmt::Debug for EValueRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("EValueRef");
                if let ::core::option::Option::Some(field_val) = self.val().transpose() {
                    f.field("val", &field_val);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<EValueRef<'a>> for EValue {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: EValueRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    val: if let ::core::option::Option::Some(val) = value.val()? {
                        ::core::option::Option::Some(::core::convert::TryInto::try_into(val)?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for EValueRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for EValueRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[EValueRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<EValue>> for EValue {
            type Value = ::planus::Offset<EValue>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<EValue>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for EValueRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[EValueRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Operator` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Operator` in the file `schema/program.fbs:123`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Operator {
            /// The field `name` in the table `Operator`
            pub name: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `overload` in the table `Operator`
            pub overload: ::core::option::Option<::planus::alloc::string::String>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Operator {
            fn default() -> Self {
                Self {
                    name: ::core::default::Default::default(),
                    overload: ::core::default::Default::default(),
                }
            }
        }

        impl Operator {
            /// Creates a [OperatorBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> OperatorBuilder<()> {
                OperatorBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_name: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                field_overload: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            ) -> ::planus::Offset<Self> {
                let prepared_name = field_name.prepare(builder);
                let prepared_overload = field_overload.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_name.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }
                if prepared_overload.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_name) = prepared_name {
                            object_writer.write::<_, _, 4>(&prepared_name);
                        }
                        if let ::core::option::Option::Some(prepared_overload) = prepared_overload {
                            object_writer.write::<_, _, 4>(&prepared_overload);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Operator>> for Operator {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Operator> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Operator>> for Operator {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Operator>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Operator> for Operator {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Operator> {
                Operator::create(builder, &self.name, &self.overload)
            }
        }

        /// Builder for serializing an instance of the [Operator] type.
        ///
        /// Can be created using the [Operator::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct OperatorBuilder<State>(State);

        impl OperatorBuilder<()> {
            /// Setter for the [`name` field](Operator#structfield.name).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn name<T0>(self, value: T0) -> OperatorBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                OperatorBuilder((value,))
            }

            /// Sets the [`name` field](Operator#structfield.name) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn name_as_null(self) -> OperatorBuilder<((),)> {
                self.name(())
            }
        }

        impl<T0> OperatorBuilder<(T0,)> {
            /// Setter for the [`overload` field](Operator#structfield.overload).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn overload<T1>(self, value: T1) -> OperatorBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                let (v0,) = self.0;
                OperatorBuilder((v0, value))
            }

            /// Sets the [`overload` field](Operator#structfield.overload) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn overload_as_null(self) -> OperatorBuilder<(T0, ())> {
                self.overload(())
            }
        }

        impl<T0, T1> OperatorBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Operator].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Operator>
            where
                Self: ::planus::WriteAsOffset<Operator>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAs<::planus::Offset<Operator>> for OperatorBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<Operator>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Operator> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAsOptional<::planus::Offset<Operator>> for OperatorBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<Operator>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Operator>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAsOffset<Operator> for OperatorBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Operator> {
                let (v0, v1) = &self.0;
                Operator::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [Operator].
        #[derive(Copy, Clone)]
        pub struct OperatorRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> OperatorRef<'a> {
            /// Getter for the [`name` field](Operator#structfield.name).
            #[inline]
            pub fn name(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "Operator", "name")
            }

            /// Getter for the [`overload` field](Operator#structfield.overload).
            #[inline]
            pub fn overload(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(1, "Operator", "overload")
            }
        }

        impl<'a> ::core::fmt::Debug for OperatorRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("OperatorRef");
                if let ::core::option::Option::Some(field_name) = self.name().transpose() {
                    f.field("name", &field_name);
                }
                if let ::core::option::Option::Some(field_overload) = self.overload().transpose() {
                    f.field("overload", &field_overload);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<OperatorRef<'a>> for Operator {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: OperatorRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    name: value.name()?.map(::core::convert::Into::into),
                    overload: value.overload()?.map(::core::convert::Into::into),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for OperatorRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for OperatorRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[OperatorRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Operator>> for Operator {
            type Value = ::planus::Offset<Operator>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Operator>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for OperatorRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[OperatorRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `KernelCall` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `KernelCall` in the file `schema/program.fbs:128`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct KernelCall {
            /// The field `op_index` in the table `KernelCall`
            pub op_index: i32,
            /// The field `args` in the table `KernelCall`
            pub args: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for KernelCall {
            fn default() -> Self {
                Self {
                    op_index: 0,
                    args: ::core::default::Default::default(),
                }
            }
        }

        impl KernelCall {
            /// Creates a [KernelCallBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> KernelCallBuilder<()> {
                KernelCallBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_op_index: impl ::planus::WriteAsDefault<i32, i32>,
                field_args: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_op_index = field_op_index.prepare(builder, &0);
                let prepared_args = field_args.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_op_index.is_some() {
                    table_writer.write_entry::<i32>(0);
                }
                if prepared_args.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_op_index) = prepared_op_index {
                            object_writer.write::<_, _, 4>(&prepared_op_index);
                        }
                        if let ::core::option::Option::Some(prepared_args) = prepared_args {
                            object_writer.write::<_, _, 4>(&prepared_args);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<KernelCall>> for KernelCall {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<KernelCall> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<KernelCall>> for KernelCall {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<KernelCall>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<KernelCall> for KernelCall {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<KernelCall> {
                KernelCall::create(builder, self.op_index, &self.args)
            }
        }

        /// Builder for serializing an instance of the [KernelCall] type.
        ///
        /// Can be created using the [KernelCall::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct KernelCallBuilder<State>(State);

        impl KernelCallBuilder<()> {
            /// Setter for the [`op_index` field](KernelCall#structfield.op_index).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn op_index<T0>(self, value: T0) -> KernelCallBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<i32, i32>,
            {
                KernelCallBuilder((value,))
            }

            /// Sets the [`op_index` field](KernelCall#structfield.op_index) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn op_index_as_default(self) -> KernelCallBuilder<(::planus::DefaultValue,)> {
                self.op_index(::planus::DefaultValue)
            }
        }

        impl<T0> KernelCallBuilder<(T0,)> {
            /// Setter for the [`args` field](KernelCall#structfield.args).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn args<T1>(self, value: T1) -> KernelCallBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                let (v0,) = self.0;
                KernelCallBuilder((v0, value))
            }

            /// Sets the [`args` field](KernelCall#structfield.args) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn args_as_null(self) -> KernelCallBuilder<(T0, ())> {
                self.args(())
            }
        }

        impl<T0, T1> KernelCallBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [KernelCall].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<KernelCall>
            where
                Self: ::planus::WriteAsOffset<KernelCall>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<i32, i32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            > ::planus::WriteAs<::planus::Offset<KernelCall>> for KernelCallBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<KernelCall>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<KernelCall> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<i32, i32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            > ::planus::WriteAsOptional<::planus::Offset<KernelCall>>
            for KernelCallBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<KernelCall>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<KernelCall>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<i32, i32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            > ::planus::WriteAsOffset<KernelCall> for KernelCallBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<KernelCall> {
                let (v0, v1) = &self.0;
                KernelCall::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [KernelCall].
        #[derive(Copy, Clone)]
        pub struct KernelCallRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> KernelCallRef<'a> {
            /// Getter for the [`op_index` field](KernelCall#structfield.op_index).
            #[inline]
            pub fn op_index(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(self.0.access(0, "KernelCall", "op_index")?.unwrap_or(0))
            }

            /// Getter for the [`args` field](KernelCall#structfield.args).
            #[inline]
            pub fn args(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(1, "KernelCall", "args")
            }
        }

        impl<'a> ::core::fmt::Debug for KernelCallRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("KernelCallRef");
                f.field("op_index", &self.op_index());
                if let ::core::option::Option::Some(field_args) = self.args().transpose() {
                    f.field("args", &field_args);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<KernelCallRef<'a>> for KernelCall {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: KernelCallRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    op_index: ::core::convert::TryInto::try_into(value.op_index()?)?,
                    args: if let ::core::option::Option::Some(args) = value.args()? {
                        ::core::option::Option::Some(args.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for KernelCallRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for KernelCallRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[KernelCallRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<KernelCall>> for KernelCall {
            type Value = ::planus::Offset<KernelCall>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<KernelCall>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for KernelCallRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[KernelCallRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `DelegateCall` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `DelegateCall` in the file `schema/program.fbs:133`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct DelegateCall {
            /// The field `delegate_index` in the table `DelegateCall`
            pub delegate_index: i32,
            /// The field `args` in the table `DelegateCall`
            pub args: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for DelegateCall {
            fn default() -> Self {
                Self {
                    delegate_index: 0,
                    args: ::core::default::Default::default(),
                }
            }
        }

        impl DelegateCall {
            /// Creates a [DelegateCallBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> DelegateCallBuilder<()> {
                DelegateCallBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_delegate_index: impl ::planus::WriteAsDefault<i32, i32>,
                field_args: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_delegate_index = field_delegate_index.prepare(builder, &0);
                let prepared_args = field_args.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_delegate_index.is_some() {
                    table_writer.write_entry::<i32>(0);
                }
                if prepared_args.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_delegate_index) =
                            prepared_delegate_index
                        {
                            object_writer.write::<_, _, 4>(&prepared_delegate_index);
                        }
                        if let ::core::option::Option::Some(prepared_args) = prepared_args {
                            object_writer.write::<_, _, 4>(&prepared_args);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<DelegateCall>> for DelegateCall {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DelegateCall> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<DelegateCall>> for DelegateCall {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<DelegateCall>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<DelegateCall> for DelegateCall {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DelegateCall> {
                DelegateCall::create(builder, self.delegate_index, &self.args)
            }
        }

        /// Builder for serializing an instance of the [DelegateCall] type.
        ///
        /// Can be created using the [DelegateCall::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct DelegateCallBuilder<State>(State);

        impl DelegateCallBuilder<()> {
            /// Setter for the [`delegate_index` field](DelegateCall#structfield.delegate_index).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn delegate_index<T0>(self, value: T0) -> DelegateCallBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<i32, i32>,
            {
                DelegateCallBuilder((value,))
            }

            /// Sets the [`delegate_index` field](DelegateCall#structfield.delegate_index) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn delegate_index_as_default(
                self,
            ) -> DelegateCallBuilder<(::planus::DefaultValue,)> {
                self.delegate_index(::planus::DefaultValue)
            }
        }

        impl<T0> DelegateCallBuilder<(T0,)> {
            /// Setter for the [`args` field](DelegateCall#structfield.args).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn args<T1>(self, value: T1) -> DelegateCallBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                let (v0,) = self.0;
                DelegateCallBuilder((v0, value))
            }

            /// Sets the [`args` field](DelegateCall#structfield.args) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn args_as_null(self) -> DelegateCallBuilder<(T0, ())> {
                self.args(())
            }
        }

        impl<T0, T1> DelegateCallBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [DelegateCall].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<DelegateCall>
            where
                Self: ::planus::WriteAsOffset<DelegateCall>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<i32, i32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            > ::planus::WriteAs<::planus::Offset<DelegateCall>> for DelegateCallBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<DelegateCall>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DelegateCall> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<i32, i32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            > ::planus::WriteAsOptional<::planus::Offset<DelegateCall>>
            for DelegateCallBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<DelegateCall>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<DelegateCall>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<i32, i32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            > ::planus::WriteAsOffset<DelegateCall> for DelegateCallBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DelegateCall> {
                let (v0, v1) = &self.0;
                DelegateCall::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [DelegateCall].
        #[derive(Copy, Clone)]
        pub struct DelegateCallRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> DelegateCallRef<'a> {
            /// Getter for the [`delegate_index` field](DelegateCall#structfield.delegate_index).
            #[inline]
            pub fn delegate_index(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "DelegateCall", "delegate_index")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`args` field](DelegateCall#structfield.args).
            #[inline]
            pub fn args(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(1, "DelegateCall", "args")
            }
        }

        impl<'a> ::core::fmt::Debug for DelegateCallRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("DelegateCallRef");
                f.field("delegate_index", &self.delegate_index());
                if let ::core::option::Option::Some(field_args) = self.args().transpose() {
                    f.field("args", &field_args);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<DelegateCallRef<'a>> for DelegateCall {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: DelegateCallRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    delegate_index: ::core::convert::TryInto::try_into(value.delegate_index()?)?,
                    args: if let ::core::option::Option::Some(args) = value.args()? {
                        ::core::option::Option::Some(args.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for DelegateCallRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for DelegateCallRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[DelegateCallRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<DelegateCall>> for DelegateCall {
            type Value = ::planus::Offset<DelegateCall>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<DelegateCall>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for DelegateCallRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[DelegateCallRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `MoveCall` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `MoveCall` in the file `schema/program.fbs:138`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct MoveCall {
            /// The field `move_from` in the table `MoveCall`
            pub move_from: i32,
            /// The field `move_to` in the table `MoveCall`
            pub move_to: i32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for MoveCall {
            fn default() -> Self {
                Self {
                    move_from: 0,
                    move_to: 0,
                }
            }
        }

        impl MoveCall {
            /// Creates a [MoveCallBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> MoveCallBuilder<()> {
                MoveCallBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_move_from: impl ::planus::WriteAsDefault<i32, i32>,
                field_move_to: impl ::planus::WriteAsDefault<i32, i32>,
            ) -> ::planus::Offset<Self> {
                let prepared_move_from = field_move_from.prepare(builder, &0);
                let prepared_move_to = field_move_to.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_move_from.is_some() {
                    table_writer.write_entry::<i32>(0);
                }
                if prepared_move_to.is_some() {
                    table_writer.write_entry::<i32>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_move_from) = prepared_move_from
                        {
                            object_writer.write::<_, _, 4>(&prepared_move_from);
                        }
                        if let ::core::option::Option::Some(prepared_move_to) = prepared_move_to {
                            object_writer.write::<_, _, 4>(&prepared_move_to);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<MoveCall>> for MoveCall {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<MoveCall> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<MoveCall>> for MoveCall {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<MoveCall>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<MoveCall> for MoveCall {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<MoveCall> {
                MoveCall::create(builder, self.move_from, self.move_to)
            }
        }

        /// Builder for serializing an instance of the [MoveCall] type.
        ///
        /// Can be created using the [MoveCall::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct MoveCallBuilder<State>(State);

        impl MoveCallBuilder<()> {
            /// Setter for the [`move_from` field](MoveCall#structfield.move_from).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn move_from<T0>(self, value: T0) -> MoveCallBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<i32, i32>,
            {
                MoveCallBuilder((value,))
            }

            /// Sets the [`move_from` field](MoveCall#structfield.move_from) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn move_from_as_default(self) -> MoveCallBuilder<(::planus::DefaultValue,)> {
                self.move_from(::planus::DefaultValue)
            }
        }

        impl<T0> MoveCallBuilder<(T0,)> {
            /// Setter for the [`move_to` field](MoveCall#structfield.move_to).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn move_to<T1>(self, value: T1) -> MoveCallBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<i32, i32>,
            {
                let (v0,) = self.0;
                MoveCallBuilder((v0, value))
            }

            /// Sets the [`move_to` field](MoveCall#structfield.move_to) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn move_to_as_default(self) -> MoveCallBuilder<(T0, ::planus::DefaultValue)> {
                self.move_to(::planus::DefaultValue)
            }
        }

        impl<T0, T1> MoveCallBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [MoveCall].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<MoveCall>
            where
                Self: ::planus::WriteAsOffset<MoveCall>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>, T1: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAs<::planus::Offset<MoveCall>> for MoveCallBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<MoveCall>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<MoveCall> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>, T1: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAsOptional<::planus::Offset<MoveCall>> for MoveCallBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<MoveCall>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<MoveCall>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>, T1: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAsOffset<MoveCall> for MoveCallBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<MoveCall> {
                let (v0, v1) = &self.0;
                MoveCall::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [MoveCall].
        #[derive(Copy, Clone)]
        pub struct MoveCallRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> MoveCallRef<'a> {
            /// Getter for the [`move_from` field](MoveCall#structfield.move_from).
            #[inline]
            pub fn move_from(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(self.0.access(0, "MoveCall", "move_from")?.unwrap_or(0))
            }

            /// Getter for the [`move_to` field](MoveCall#structfield.move_to).
            #[inline]
            pub fn move_to(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(self.0.access(1, "MoveCall", "move_to")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for MoveCallRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("MoveCallRef");
                f.field("move_from", &self.move_from());
                f.field("move_to", &self.move_to());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<MoveCallRef<'a>> for MoveCall {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: MoveCallRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    move_from: ::core::convert::TryInto::try_into(value.move_from()?)?,
                    move_to: ::core::convert::TryInto::try_into(value.move_to()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for MoveCallRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for MoveCallRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[MoveCallRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<MoveCall>> for MoveCall {
            type Value = ::planus::Offset<MoveCall>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<MoveCall>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for MoveCallRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[MoveCallRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `JumpFalseCall` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `JumpFalseCall` in the file `schema/program.fbs:143`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct JumpFalseCall {
            /// The field `cond_value_index` in the table `JumpFalseCall`
            pub cond_value_index: i32,
            /// The field `destination_instruction` in the table `JumpFalseCall`
            pub destination_instruction: i32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for JumpFalseCall {
            fn default() -> Self {
                Self {
                    cond_value_index: 0,
                    destination_instruction: 0,
                }
            }
        }

        impl JumpFalseCall {
            /// Creates a [JumpFalseCallBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> JumpFalseCallBuilder<()> {
                JumpFalseCallBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_cond_value_index: impl ::planus::WriteAsDefault<i32, i32>,
                field_destination_instruction: impl ::planus::WriteAsDefault<i32, i32>,
            ) -> ::planus::Offset<Self> {
                let prepared_cond_value_index = field_cond_value_index.prepare(builder, &0);
                let prepared_destination_instruction =
                    field_destination_instruction.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_cond_value_index.is_some() {
                    table_writer.write_entry::<i32>(0);
                }
                if prepared_destination_instruction.is_some() {
                    table_writer.write_entry::<i32>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_cond_value_index) =
                            prepared_cond_value_index
                        {
                            object_writer.write::<_, _, 4>(&prepared_cond_value_index);
                        }
                        if let ::core::option::Option::Some(prepared_destination_instruction) =
                            prepared_destination_instruction
                        {
                            object_writer.write::<_, _, 4>(&prepared_destination_instruction);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<JumpFalseCall>> for JumpFalseCall {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<JumpFalseCall> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<JumpFalseCall>> for JumpFalseCall {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<JumpFalseCall>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<JumpFalseCall> for JumpFalseCall {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<JumpFalseCall> {
                JumpFalseCall::create(builder, self.cond_value_index, self.destination_instruction)
            }
        }

        /// Builder for serializing an instance of the [JumpFalseCall] type.
        ///
        /// Can be created using the [JumpFalseCall::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct JumpFalseCallBuilder<State>(State);

        impl JumpFalseCallBuilder<()> {
            /// Setter for the [`cond_value_index` field](JumpFalseCall#structfield.cond_value_index).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn cond_value_index<T0>(self, value: T0) -> JumpFalseCallBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<i32, i32>,
            {
                JumpFalseCallBuilder((value,))
            }

            /// Sets the [`cond_value_index` field](JumpFalseCall#structfield.cond_value_index) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn cond_value_index_as_default(
                self,
            ) -> JumpFalseCallBuilder<(::planus::DefaultValue,)> {
                self.cond_value_index(::planus::DefaultValue)
            }
        }

        impl<T0> JumpFalseCallBuilder<(T0,)> {
            /// Setter for the [`destination_instruction` field](JumpFalseCall#structfield.destination_instruction).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn destination_instruction<T1>(self, value: T1) -> JumpFalseCallBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<i32, i32>,
            {
                let (v0,) = self.0;
                JumpFalseCallBuilder((v0, value))
            }

            /// Sets the [`destination_instruction` field](JumpFalseCall#structfield.destination_instruction) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn destination_instruction_as_default(
                self,
            ) -> JumpFalseCallBuilder<(T0, ::planus::DefaultValue)> {
                self.destination_instruction(::planus::DefaultValue)
            }
        }

        impl<T0, T1> JumpFalseCallBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [JumpFalseCall].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<JumpFalseCall>
            where
                Self: ::planus::WriteAsOffset<JumpFalseCall>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>, T1: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAs<::planus::Offset<JumpFalseCall>> for JumpFalseCallBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<JumpFalseCall>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<JumpFalseCall> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>, T1: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAsOptional<::planus::Offset<JumpFalseCall>>
            for JumpFalseCallBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<JumpFalseCall>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<JumpFalseCall>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>, T1: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAsOffset<JumpFalseCall> for JumpFalseCallBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<JumpFalseCall> {
                let (v0, v1) = &self.0;
                JumpFalseCall::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [JumpFalseCall].
        #[derive(Copy, Clone)]
        pub struct JumpFalseCallRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> JumpFalseCallRef<'a> {
            /// Getter for the [`cond_value_index` field](JumpFalseCall#structfield.cond_value_index).
            #[inline]
            pub fn cond_value_index(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "JumpFalseCall", "cond_value_index")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`destination_instruction` field](JumpFalseCall#structfield.destination_instruction).
            #[inline]
            pub fn destination_instruction(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "JumpFalseCall", "destination_instruction")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for JumpFalseCallRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("JumpFalseCallRef");
                f.field("cond_value_index", &self.cond_value_index());
                f.field("destination_instruction", &self.destination_instruction());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<JumpFalseCallRef<'a>> for JumpFalseCall {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: JumpFalseCallRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    cond_value_index: ::core::convert::TryInto::try_into(
                        value.cond_value_index()?,
                    )?,
                    destination_instruction: ::core::convert::TryInto::try_into(
                        value.destination_instruction()?,
                    )?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for JumpFalseCallRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for JumpFalseCallRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[JumpFalseCallRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<JumpFalseCall>> for JumpFalseCall {
            type Value = ::planus::Offset<JumpFalseCall>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<JumpFalseCall>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for JumpFalseCallRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[JumpFalseCallRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `FreeCall` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `FreeCall` in the file `schema/program.fbs:148`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct FreeCall {
            /// The field `value_index` in the table `FreeCall`
            pub value_index: i32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for FreeCall {
            fn default() -> Self {
                Self { value_index: 0 }
            }
        }

        impl FreeCall {
            /// Creates a [FreeCallBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> FreeCallBuilder<()> {
                FreeCallBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_value_index: impl ::planus::WriteAsDefault<i32, i32>,
            ) -> ::planus::Offset<Self> {
                let prepared_value_index = field_value_index.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_value_index.is_some() {
                    table_writer.write_entry::<i32>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_value_index) =
                            prepared_value_index
                        {
                            object_writer.write::<_, _, 4>(&prepared_value_index);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<FreeCall>> for FreeCall {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FreeCall> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<FreeCall>> for FreeCall {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<FreeCall>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<FreeCall> for FreeCall {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FreeCall> {
                FreeCall::create(builder, self.value_index)
            }
        }

        /// Builder for serializing an instance of the [FreeCall] type.
        ///
        /// Can be created using the [FreeCall::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct FreeCallBuilder<State>(State);

        impl FreeCallBuilder<()> {
            /// Setter for the [`value_index` field](FreeCall#structfield.value_index).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn value_index<T0>(self, value: T0) -> FreeCallBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<i32, i32>,
            {
                FreeCallBuilder((value,))
            }

            /// Sets the [`value_index` field](FreeCall#structfield.value_index) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn value_index_as_default(self) -> FreeCallBuilder<(::planus::DefaultValue,)> {
                self.value_index(::planus::DefaultValue)
            }
        }

        impl<T0> FreeCallBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [FreeCall].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<FreeCall>
            where
                Self: ::planus::WriteAsOffset<FreeCall>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>> ::planus::WriteAs<::planus::Offset<FreeCall>>
            for FreeCallBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<FreeCall>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FreeCall> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAsOptional<::planus::Offset<FreeCall>> for FreeCallBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<FreeCall>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<FreeCall>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>> ::planus::WriteAsOffset<FreeCall>
            for FreeCallBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FreeCall> {
                let (v0,) = &self.0;
                FreeCall::create(builder, v0)
            }
        }

        /// Reference to a deserialized [FreeCall].
        #[derive(Copy, Clone)]
        pub struct FreeCallRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> FreeCallRef<'a> {
            /// Getter for the [`value_index` field](FreeCall#structfield.value_index).
            #[inline]
            pub fn value_index(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0.access(0, "FreeCall", "value_index")?.unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for FreeCallRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("FreeCallRef");
                f.field("value_index", &self.value_index());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<FreeCallRef<'a>> for FreeCall {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: FreeCallRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    value_index: ::core::convert::TryInto::try_into(value.value_index()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for FreeCallRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for FreeCallRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[FreeCallRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<FreeCall>> for FreeCall {
            type Value = ::planus::Offset<FreeCall>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<FreeCall>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for FreeCallRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[FreeCallRef]", "read_as_root", 0)
                })
            }
        }

        /// The union `InstructionArguments` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Union `InstructionArguments` in the file `schema/program.fbs:152`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub enum InstructionArguments {
            /// The variant of type `KernelCall` in the union `InstructionArguments`
            KernelCall(::planus::alloc::boxed::Box<self::KernelCall>),

            /// The variant of type `DelegateCall` in the union `InstructionArguments`
            DelegateCall(::planus::alloc::boxed::Box<self::DelegateCall>),

            /// The variant of type `MoveCall` in the union `InstructionArguments`
            MoveCall(::planus::alloc::boxed::Box<self::MoveCall>),

            /// The variant of type `JumpFalseCall` in the union `InstructionArguments`
            JumpFalseCall(::planus::alloc::boxed::Box<self::JumpFalseCall>),

            /// The variant of type `FreeCall` in the union `InstructionArguments`
            FreeCall(::planus::alloc::boxed::Box<self::FreeCall>),
        }

        impl InstructionArguments {
            /// Creates a [InstructionArgumentsBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> InstructionArgumentsBuilder<::planus::Uninitialized> {
                InstructionArgumentsBuilder(::planus::Uninitialized)
            }

            #[inline]
            pub fn create_kernel_call(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::KernelCall>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(1, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_delegate_call(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::DelegateCall>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(2, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_move_call(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::MoveCall>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(3, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_jump_false_call(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::JumpFalseCall>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(4, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_free_call(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::FreeCall>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(5, value.prepare(builder).downcast())
            }
        }

        impl ::planus::WriteAsUnion<InstructionArguments> for InstructionArguments {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::UnionOffset<Self> {
                match self {
                    Self::KernelCall(value) => Self::create_kernel_call(builder, value),
                    Self::DelegateCall(value) => Self::create_delegate_call(builder, value),
                    Self::MoveCall(value) => Self::create_move_call(builder, value),
                    Self::JumpFalseCall(value) => Self::create_jump_false_call(builder, value),
                    Self::FreeCall(value) => Self::create_free_call(builder, value),
                }
            }
        }

        impl ::planus::WriteAsOptionalUnion<InstructionArguments> for InstructionArguments {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<Self>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Builder for serializing an instance of the [InstructionArguments] type.
        ///
        /// Can be created using the [InstructionArguments::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct InstructionArgumentsBuilder<T>(T);

        impl InstructionArgumentsBuilder<::planus::Uninitialized> {
            /// Creates an instance of the [`KernelCall` variant](InstructionArguments#variant.KernelCall).
            #[inline]
            pub fn kernel_call<T>(
                self,
                value: T,
            ) -> InstructionArgumentsBuilder<::planus::Initialized<1, T>>
            where
                T: ::planus::WriteAsOffset<self::KernelCall>,
            {
                InstructionArgumentsBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`DelegateCall` variant](InstructionArguments#variant.DelegateCall).
            #[inline]
            pub fn delegate_call<T>(
                self,
                value: T,
            ) -> InstructionArgumentsBuilder<::planus::Initialized<2, T>>
            where
                T: ::planus::WriteAsOffset<self::DelegateCall>,
            {
                InstructionArgumentsBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`MoveCall` variant](InstructionArguments#variant.MoveCall).
            #[inline]
            pub fn move_call<T>(
                self,
                value: T,
            ) -> InstructionArgumentsBuilder<::planus::Initialized<3, T>>
            where
                T: ::planus::WriteAsOffset<self::MoveCall>,
            {
                InstructionArgumentsBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`JumpFalseCall` variant](InstructionArguments#variant.JumpFalseCall).
            #[inline]
            pub fn jump_false_call<T>(
                self,
                value: T,
            ) -> InstructionArgumentsBuilder<::planus::Initialized<4, T>>
            where
                T: ::planus::WriteAsOffset<self::JumpFalseCall>,
            {
                InstructionArgumentsBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`FreeCall` variant](InstructionArguments#variant.FreeCall).
            #[inline]
            pub fn free_call<T>(
                self,
                value: T,
            ) -> InstructionArgumentsBuilder<::planus::Initialized<5, T>>
            where
                T: ::planus::WriteAsOffset<self::FreeCall>,
            {
                InstructionArgumentsBuilder(::planus::Initialized(value))
            }
        }

        impl<const N: u8, T> InstructionArgumentsBuilder<::planus::Initialized<N, T>> {
            /// Finish writing the builder to get an [UnionOffset](::planus::UnionOffset) to a serialized [InstructionArguments].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<InstructionArguments>
            where
                Self: ::planus::WriteAsUnion<InstructionArguments>,
            {
                ::planus::WriteAsUnion::prepare(&self, builder)
            }
        }

        impl<T> ::planus::WriteAsUnion<InstructionArguments>
            for InstructionArgumentsBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::KernelCall>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<InstructionArguments> {
                ::planus::UnionOffset::new(1, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<InstructionArguments>
            for InstructionArgumentsBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::KernelCall>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<InstructionArguments>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<InstructionArguments>
            for InstructionArgumentsBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::DelegateCall>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<InstructionArguments> {
                ::planus::UnionOffset::new(2, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<InstructionArguments>
            for InstructionArgumentsBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::DelegateCall>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<InstructionArguments>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<InstructionArguments>
            for InstructionArgumentsBuilder<::planus::Initialized<3, T>>
        where
            T: ::planus::WriteAsOffset<self::MoveCall>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<InstructionArguments> {
                ::planus::UnionOffset::new(3, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<InstructionArguments>
            for InstructionArgumentsBuilder<::planus::Initialized<3, T>>
        where
            T: ::planus::WriteAsOffset<self::MoveCall>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<InstructionArguments>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<InstructionArguments>
            for InstructionArgumentsBuilder<::planus::Initialized<4, T>>
        where
            T: ::planus::WriteAsOffset<self::JumpFalseCall>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<InstructionArguments> {
                ::planus::UnionOffset::new(4, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<InstructionArguments>
            for InstructionArgumentsBuilder<::planus::Initialized<4, T>>
        where
            T: ::planus::WriteAsOffset<self::JumpFalseCall>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<InstructionArguments>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<InstructionArguments>
            for InstructionArgumentsBuilder<::planus::Initialized<5, T>>
        where
            T: ::planus::WriteAsOffset<self::FreeCall>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<InstructionArguments> {
                ::planus::UnionOffset::new(5, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<InstructionArguments>
            for InstructionArgumentsBuilder<::planus::Initialized<5, T>>
        where
            T: ::planus::WriteAsOffset<self::FreeCall>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<InstructionArguments>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Reference to a deserialized [InstructionArguments].
        #[derive(Copy, Clone, Debug)]
        pub enum InstructionArgumentsRef<'a> {
            KernelCall(self::KernelCallRef<'a>),
            DelegateCall(self::DelegateCallRef<'a>),
            MoveCall(self::MoveCallRef<'a>),
            JumpFalseCall(self::JumpFalseCallRef<'a>),
            FreeCall(self::FreeCallRef<'a>),
        }

        impl<'a> ::core::convert::TryFrom<InstructionArgumentsRef<'a>> for InstructionArguments {
            type Error = ::planus::Error;

            fn try_from(value: InstructionArgumentsRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(match value {
                    InstructionArgumentsRef::KernelCall(value) => {
                        Self::KernelCall(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    InstructionArgumentsRef::DelegateCall(value) => {
                        Self::DelegateCall(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    InstructionArgumentsRef::MoveCall(value) => {
                        Self::MoveCall(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    InstructionArgumentsRef::JumpFalseCall(value) => {
                        Self::JumpFalseCall(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    InstructionArgumentsRef::FreeCall(value) => {
                        Self::FreeCall(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }
                })
            }
        }

        impl<'a> ::planus::TableReadUnion<'a> for InstructionArgumentsRef<'a> {
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                tag: u8,
                field_offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                match tag {
                    1 => ::core::result::Result::Ok(Self::KernelCall(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    2 => ::core::result::Result::Ok(Self::DelegateCall(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    3 => ::core::result::Result::Ok(Self::MoveCall(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    4 => ::core::result::Result::Ok(Self::JumpFalseCall(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    5 => ::core::result::Result::Ok(Self::FreeCall(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    _ => {
                        ::core::result::Result::Err(::planus::errors::ErrorKind::UnknownUnionTag {
                            tag,
                        })
                    }
                }
            }
        }

        impl<'a> ::planus::VectorReadUnion<'a> for InstructionArgumentsRef<'a> {
            const VECTOR_NAME: &'static str = "[InstructionArgumentsRef]";
        }

        /// The table `Instruction` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Instruction` in the file `schema/program.fbs:160`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Instruction {
            /// The field `instr_args` in the table `Instruction`
            pub instr_args: ::core::option::Option<self::InstructionArguments>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Instruction {
            fn default() -> Self {
                Self {
                    instr_args: ::core::default::Default::default(),
                }
            }
        }

        impl Instruction {
            /// Creates a [InstructionBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> InstructionBuilder<()> {
                InstructionBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_instr_args: impl ::planus::WriteAsOptionalUnion<self::InstructionArguments>,
            ) -> ::planus::Offset<Self> {
                let prepared_instr_args = field_instr_args.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_instr_args.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::InstructionArguments>>(1);
                }
                if prepared_instr_args.is_some() {
                    table_writer.write_entry::<u8>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_instr_args) =
                            prepared_instr_args
                        {
                            object_writer.write::<_, _, 4>(&prepared_instr_args.offset());
                        }
                        if let ::core::option::Option::Some(prepared_instr_args) =
                            prepared_instr_args
                        {
                            object_writer.write::<_, _, 1>(&prepared_instr_args.tag());
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Instruction>> for Instruction {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Instruction> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Instruction>> for Instruction {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Instruction>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Instruction> for Instruction {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Instruction> {
                Instruction::create(builder, &self.instr_args)
            }
        }

        /// Builder for serializing an instance of the [Instruction] type.
        ///
        /// Can be created using the [Instruction::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct InstructionBuilder<State>(State);

        impl InstructionBuilder<()> {
            /// Setter for the [`instr_args` field](Instruction#structfield.instr_args).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn instr_args<T0>(self, value: T0) -> InstructionBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptionalUnion<self::InstructionArguments>,
            {
                InstructionBuilder((value,))
            }

            /// Sets the [`instr_args` field](Instruction#structfield.instr_args) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn instr_args_as_null(self) -> InstructionBuilder<((),)> {
                self.instr_args(())
            }
        }

        impl<T0> InstructionBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Instruction].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Instruction>
            where
                Self: ::planus::WriteAsOffset<Instruction>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::InstructionArguments>>
            ::planus::WriteAs<::planus::Offset<Instruction>> for InstructionBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Instruction>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Instruction> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::InstructionArguments>>
            ::planus::WriteAsOptional<::planus::Offset<Instruction>> for InstructionBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Instruction>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Instruction>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::InstructionArguments>>
            ::planus::WriteAsOffset<Instruction> for InstructionBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Instruction> {
                let (v0,) = &self.0;
                Instruction::create(builder, v0)
            }
        }

        /// Reference to a deserialized [Instruction].
        #[derive(Copy, Clone)]
        pub struct InstructionRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> InstructionRef<'a> {
            /// Getter for the [`instr_args` field](Instruction#structfield.instr_args).
            #[inline]
            pub fn instr_args(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::InstructionArgumentsRef<'a>>>
            {
                self.0.access_union(0, "Instruction", "instr_args")
            }
        }

        impl<'a> ::core::fmt::Debug for InstructionRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("InstructionRef");
                if let ::core::option::Option::Some(field_instr_args) =
                    self.instr_args().transpose()
                {
                    f.field("instr_args", &field_instr_args);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<InstructionRef<'a>> for Instruction {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: InstructionRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    instr_args: if let ::core::option::Option::Some(instr_args) =
                        value.instr_args()?
                    {
                        ::core::option::Option::Some(::core::convert::TryInto::try_into(
                            instr_args,
                        )?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for InstructionRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for InstructionRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[InstructionRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Instruction>> for Instruction {
            type Value = ::planus::Offset<Instruction>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Instruction>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for InstructionRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[InstructionRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Frame` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Frame` in the file `schema/program.fbs:164`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Frame {
            /// The field `filename` in the table `Frame`
            pub filename: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `lineno` in the table `Frame`
            pub lineno: i32,
            /// The field `name` in the table `Frame`
            pub name: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `context` in the table `Frame`
            pub context: ::core::option::Option<::planus::alloc::string::String>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Frame {
            fn default() -> Self {
                Self {
                    filename: ::core::default::Default::default(),
                    lineno: 0,
                    name: ::core::default::Default::default(),
                    context: ::core::default::Default::default(),
                }
            }
        }

        impl Frame {
            /// Creates a [FrameBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> FrameBuilder<()> {
                FrameBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_filename: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                field_lineno: impl ::planus::WriteAsDefault<i32, i32>,
                field_name: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                field_context: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            ) -> ::planus::Offset<Self> {
                let prepared_filename = field_filename.prepare(builder);
                let prepared_lineno = field_lineno.prepare(builder, &0);
                let prepared_name = field_name.prepare(builder);
                let prepared_context = field_context.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<12> =
                    ::core::default::Default::default();
                if prepared_filename.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }
                if prepared_lineno.is_some() {
                    table_writer.write_entry::<i32>(1);
                }
                if prepared_name.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(2);
                }
                if prepared_context.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(3);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_filename) = prepared_filename {
                            object_writer.write::<_, _, 4>(&prepared_filename);
                        }
                        if let ::core::option::Option::Some(prepared_lineno) = prepared_lineno {
                            object_writer.write::<_, _, 4>(&prepared_lineno);
                        }
                        if let ::core::option::Option::Some(prepared_name) = prepared_name {
                            object_writer.write::<_, _, 4>(&prepared_name);
                        }
                        if let ::core::option::Option::Some(prepared_context) = prepared_context {
                            object_writer.write::<_, _, 4>(&prepared_context);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Frame>> for Frame {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Frame> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Frame>> for Frame {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Frame>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Frame> for Frame {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Frame> {
                Frame::create(
                    builder,
                    &self.filename,
                    self.lineno,
                    &self.name,
                    &self.context,
                )
            }
        }

        /// Builder for serializing an instance of the [Frame] type.
        ///
        /// Can be created using the [Frame::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct FrameBuilder<State>(State);

        impl FrameBuilder<()> {
            /// Setter for the [`filename` field](Frame#structfield.filename).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn filename<T0>(self, value: T0) -> FrameBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                FrameBuilder((value,))
            }

            /// Sets the [`filename` field](Frame#structfield.filename) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn filename_as_null(self) -> FrameBuilder<((),)> {
                self.filename(())
            }
        }

        impl<T0> FrameBuilder<(T0,)> {
            /// Setter for the [`lineno` field](Frame#structfield.lineno).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn lineno<T1>(self, value: T1) -> FrameBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<i32, i32>,
            {
                let (v0,) = self.0;
                FrameBuilder((v0, value))
            }

            /// Sets the [`lineno` field](Frame#structfield.lineno) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn lineno_as_default(self) -> FrameBuilder<(T0, ::planus::DefaultValue)> {
                self.lineno(::planus::DefaultValue)
            }
        }

        impl<T0, T1> FrameBuilder<(T0, T1)> {
            /// Setter for the [`name` field](Frame#structfield.name).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn name<T2>(self, value: T2) -> FrameBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                let (v0, v1) = self.0;
                FrameBuilder((v0, v1, value))
            }

            /// Sets the [`name` field](Frame#structfield.name) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn name_as_null(self) -> FrameBuilder<(T0, T1, ())> {
                self.name(())
            }
        }

        impl<T0, T1, T2> FrameBuilder<(T0, T1, T2)> {
            /// Setter for the [`context` field](Frame#structfield.context).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn context<T3>(self, value: T3) -> FrameBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                let (v0, v1, v2) = self.0;
                FrameBuilder((v0, v1, v2, value))
            }

            /// Sets the [`context` field](Frame#structfield.context) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn context_as_null(self) -> FrameBuilder<(T0, T1, T2, ())> {
                self.context(())
            }
        }

        impl<T0, T1, T2, T3> FrameBuilder<(T0, T1, T2, T3)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Frame].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Frame>
            where
                Self: ::planus::WriteAsOffset<Frame>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAs<::planus::Offset<Frame>> for FrameBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<Frame>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Frame> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAsOptional<::planus::Offset<Frame>>
            for FrameBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<Frame>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Frame>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAsOffset<Frame> for FrameBuilder<(T0, T1, T2, T3)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Frame> {
                let (v0, v1, v2, v3) = &self.0;
                Frame::create(builder, v0, v1, v2, v3)
            }
        }

        /// Reference to a deserialized [Frame].
        #[derive(Copy, Clone)]
        pub struct FrameRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> FrameRef<'a> {
            /// Getter for the [`filename` field](Frame#structfield.filename).
            #[inline]
            pub fn filename(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "Frame", "filename")
            }

            /// Getter for the [`lineno` field](Frame#structfield.lineno).
            #[inline]
            pub fn lineno(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(self.0.access(1, "Frame", "lineno")?.unwrap_or(0))
            }

            /// Getter for the [`name` field](Frame#structfield.name).
            #[inline]
            pub fn name(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(2, "Frame", "name")
            }

            /// Getter for the [`context` field](Frame#structfield.context).
            #[inline]
            pub fn context(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(3, "Frame", "context")
            }
        }

        impl<'a> ::core::fmt::Debug for FrameRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("FrameRef");
                if let ::core::option::Option::Some(field_filename) = self.filename().transpose() {
                    f.field("filename", &field_filename);
                }
                f.field("lineno", &self.lineno());
                if let ::core::option::Option::Some(field_name) = self.name().transpose() {
                    f.field("name", &field_name);
                }
                if let ::core::option::Option::Some(field_context) = self.context().transpose() {
                    f.field("context", &field_context);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<FrameRef<'a>> for Frame {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: FrameRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    filename: value.filename()?.map(::core::convert::Into::into),
                    lineno: ::core::convert::TryInto::try_into(value.lineno()?)?,
                    name: value.name()?.map(::core::convert::Into::into),
                    context: value.context()?.map(::core::convert::Into::into),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for FrameRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for FrameRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[FrameRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Frame>> for Frame {
            type Value = ::planus::Offset<Frame>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Frame>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for FrameRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[FrameRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `FrameList` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `FrameList` in the file `schema/program.fbs:171`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct FrameList {
            /// The field `items` in the table `FrameList`
            pub items: ::core::option::Option<::planus::alloc::vec::Vec<self::Frame>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for FrameList {
            fn default() -> Self {
                Self {
                    items: ::core::default::Default::default(),
                }
            }
        }

        impl FrameList {
            /// Creates a [FrameListBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> FrameListBuilder<()> {
                FrameListBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_items: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::Frame>]>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_items = field_items.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_items.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::Frame>]>>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_items) = prepared_items {
                            object_writer.write::<_, _, 4>(&prepared_items);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<FrameList>> for FrameList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FrameList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<FrameList>> for FrameList {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<FrameList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<FrameList> for FrameList {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FrameList> {
                FrameList::create(builder, &self.items)
            }
        }

        /// Builder for serializing an instance of the [FrameList] type.
        ///
        /// Can be created using the [FrameList::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct FrameListBuilder<State>(State);

        impl FrameListBuilder<()> {
            /// Setter for the [`items` field](FrameList#structfield.items).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items<T0>(self, value: T0) -> FrameListBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Frame>]>>,
            {
                FrameListBuilder((value,))
            }

            /// Sets the [`items` field](FrameList#structfield.items) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn items_as_null(self) -> FrameListBuilder<((),)> {
                self.items(())
            }
        }

        impl<T0> FrameListBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [FrameList].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<FrameList>
            where
                Self: ::planus::WriteAsOffset<FrameList>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Frame>]>>>
            ::planus::WriteAs<::planus::Offset<FrameList>> for FrameListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<FrameList>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FrameList> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Frame>]>>>
            ::planus::WriteAsOptional<::planus::Offset<FrameList>> for FrameListBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<FrameList>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<FrameList>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Frame>]>>>
            ::planus::WriteAsOffset<FrameList> for FrameListBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FrameList> {
                let (v0,) = &self.0;
                FrameList::create(builder, v0)
            }
        }

        /// Reference to a deserialized [FrameList].
        #[derive(Copy, Clone)]
        pub struct FrameListRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> FrameListRef<'a> {
            /// Getter for the [`items` field](FrameList#structfield.items).
            #[inline]
            pub fn items(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<::planus::Vector<'a, ::planus::Result<self::FrameRef<'a>>>>,
            > {
                self.0.access(0, "FrameList", "items")
            }
        }

        impl<'a> ::core::fmt::Debug for FrameListRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("FrameListRef");
                if let ::core::option::Option::Some(field_items) = self.items().transpose() {
                    f.field("items", &field_items);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<FrameListRef<'a>> for FrameList {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: FrameListRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    items: if let ::core::option::Option::Some(items) = value.items()? {
                        ::core::option::Option::Some(items.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for FrameListRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for FrameListRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[FrameListRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<FrameList>> for FrameList {
            type Value = ::planus::Offset<FrameList>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<FrameList>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for FrameListRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[FrameListRef]", "read_as_root", 0)
                })
            }
        }

        /// The enum `DataLocation` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Enum `DataLocation` in the file `schema/program.fbs:175`
        #[derive(
            Copy,
            Clone,
            Debug,
            PartialEq,
            Eq,
            PartialOrd,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        #[repr(i8)]
        pub enum DataLocation {
            /// The variant `INLINE` in the enum `DataLocation`
            Inline = 0,

            /// The variant `SEGMENT` in the enum `DataLocation`
            Segment = 1,
        }

        impl DataLocation {
            /// Array containing all valid variants of DataLocation
            pub const ENUM_VALUES: [Self; 2] = [Self::Inline, Self::Segment];
        }

        impl ::core::convert::TryFrom<i8> for DataLocation {
            type Error = ::planus::errors::UnknownEnumTagKind;
            #[inline]
            fn try_from(
                value: i8,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTagKind> {
                #[allow(clippy::match_single_binding)]
                match value {
                    0 => ::core::result::Result::Ok(DataLocation::Inline),
                    1 => ::core::result::Result::Ok(DataLocation::Segment),

                    _ => ::core::result::Result::Err(::planus::errors::UnknownEnumTagKind {
                        tag: value as i128,
                    }),
                }
            }
        }

        impl ::core::convert::From<DataLocation> for i8 {
            #[inline]
            fn from(value: DataLocation) -> Self {
                value as i8
            }
        }

        /// # Safety
        /// The Planus compiler correctly calculates `ALIGNMENT` and `SIZE`.
        unsafe impl ::planus::Primitive for DataLocation {
            const ALIGNMENT: usize = 1;
            const SIZE: usize = 1;
        }

        impl ::planus::WriteAsPrimitive<DataLocation> for DataLocation {
            #[inline]
            fn write<const N: usize>(&self, cursor: ::planus::Cursor<'_, N>, buffer_position: u32) {
                (*self as i8).write(cursor, buffer_position);
            }
        }

        impl ::planus::WriteAs<DataLocation> for DataLocation {
            type Prepared = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> DataLocation {
                *self
            }
        }

        impl ::planus::WriteAsDefault<DataLocation, DataLocation> for DataLocation {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
                default: &DataLocation,
            ) -> ::core::option::Option<DataLocation> {
                if self == default {
                    ::core::option::Option::None
                } else {
                    ::core::option::Option::Some(*self)
                }
            }
        }

        impl ::planus::WriteAsOptional<DataLocation> for DataLocation {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<DataLocation> {
                ::core::option::Option::Some(*self)
            }
        }

        impl<'buf> ::planus::TableRead<'buf> for DataLocation {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                let n: i8 = ::planus::TableRead::from_buffer(buffer, offset)?;
                ::core::result::Result::Ok(::core::convert::TryInto::try_into(n)?)
            }
        }

        impl<'buf> ::planus::VectorReadInner<'buf> for DataLocation {
            type Error = ::planus::errors::UnknownEnumTag;
            const STRIDE: usize = 1;
            #[inline]
            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTag> {
                let value = unsafe { *buffer.buffer.get_unchecked(offset) as i8 };
                let value: ::core::result::Result<Self, _> =
                    ::core::convert::TryInto::try_into(value);
                value.map_err(|error_kind| {
                    error_kind.with_error_location(
                        "DataLocation",
                        "VectorRead::from_buffer",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<DataLocation> for DataLocation {
            const STRIDE: usize = 1;

            type Value = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> Self {
                *self
            }

            #[inline]
            unsafe fn write_values(
                values: &[Self],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 1];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - i as u32,
                    );
                }
            }
        }

        /// The table `BackendDelegateDataReference` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `BackendDelegateDataReference` in the file `schema/program.fbs:181`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct BackendDelegateDataReference {
            /// The field `location` in the table `BackendDelegateDataReference`
            pub location: self::DataLocation,
            /// The field `index` in the table `BackendDelegateDataReference`
            pub index: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for BackendDelegateDataReference {
            fn default() -> Self {
                Self {
                    location: self::DataLocation::Inline,
                    index: 0,
                }
            }
        }

        impl BackendDelegateDataReference {
            /// Creates a [BackendDelegateDataReferenceBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> BackendDelegateDataReferenceBuilder<()> {
                BackendDelegateDataReferenceBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_location: impl ::planus::WriteAsDefault<self::DataLocation, self::DataLocation>,
                field_index: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_location =
                    field_location.prepare(builder, &self::DataLocation::Inline);
                let prepared_index = field_index.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_index.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_location.is_some() {
                    table_writer.write_entry::<self::DataLocation>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_index) = prepared_index {
                            object_writer.write::<_, _, 4>(&prepared_index);
                        }
                        if let ::core::option::Option::Some(prepared_location) = prepared_location {
                            object_writer.write::<_, _, 1>(&prepared_location);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<BackendDelegateDataReference>>
            for BackendDelegateDataReference
        {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegateDataReference> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<BackendDelegateDataReference>>
            for BackendDelegateDataReference
        {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BackendDelegateDataReference>>
            {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<BackendDelegateDataReference> for BackendDelegateDataReference {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegateDataReference> {
                BackendDelegateDataReference::create(builder, self.location, self.index)
            }
        }

        /// Builder for serializing an instance of the [BackendDelegateDataReference] type.
        ///
        /// Can be created using the [BackendDelegateDataReference::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct BackendDelegateDataReferenceBuilder<State>(State);

        impl BackendDelegateDataReferenceBuilder<()> {
            /// Setter for the [`location` field](BackendDelegateDataReference#structfield.location).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn location<T0>(self, value: T0) -> BackendDelegateDataReferenceBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<self::DataLocation, self::DataLocation>,
            {
                BackendDelegateDataReferenceBuilder((value,))
            }

            /// Sets the [`location` field](BackendDelegateDataReference#structfield.location) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn location_as_default(
                self,
            ) -> BackendDelegateDataReferenceBuilder<(::planus::DefaultValue,)> {
                self.location(::planus::DefaultValue)
            }
        }

        impl<T0> BackendDelegateDataReferenceBuilder<(T0,)> {
            /// Setter for the [`index` field](BackendDelegateDataReference#structfield.index).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn index<T1>(self, value: T1) -> BackendDelegateDataReferenceBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                BackendDelegateDataReferenceBuilder((v0, value))
            }

            /// Sets the [`index` field](BackendDelegateDataReference#structfield.index) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn index_as_default(
                self,
            ) -> BackendDelegateDataReferenceBuilder<(T0, ::planus::DefaultValue)> {
                self.index(::planus::DefaultValue)
            }
        }

        impl<T0, T1> BackendDelegateDataReferenceBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [BackendDelegateDataReference].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegateDataReference>
            where
                Self: ::planus::WriteAsOffset<BackendDelegateDataReference>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<self::DataLocation, self::DataLocation>,
                T1: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<BackendDelegateDataReference>>
            for BackendDelegateDataReferenceBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<BackendDelegateDataReference>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegateDataReference> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<self::DataLocation, self::DataLocation>,
                T1: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<BackendDelegateDataReference>>
            for BackendDelegateDataReferenceBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<BackendDelegateDataReference>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BackendDelegateDataReference>>
            {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<self::DataLocation, self::DataLocation>,
                T1: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<BackendDelegateDataReference>
            for BackendDelegateDataReferenceBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegateDataReference> {
                let (v0, v1) = &self.0;
                BackendDelegateDataReference::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [BackendDelegateDataReference].
        #[derive(Copy, Clone)]
        pub struct BackendDelegateDataReferenceRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> BackendDelegateDataReferenceRef<'a> {
            /// Getter for the [`location` field](BackendDelegateDataReference#structfield.location).
            #[inline]
            pub fn location(&self) -> ::planus::Result<self::DataLocation> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "BackendDelegateDataReference", "location")?
                        .unwrap_or(self::DataLocation::Inline),
                )
            }

            /// Getter for the [`index` field](BackendDelegateDataReference#structfield.index).
            #[inline]
            pub fn index(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "BackendDelegateDataReference", "index")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for BackendDelegateDataReferenceRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("BackendDelegateDataReferenceRef");
                f.field("location", &self.location());
                f.field("index", &self.index());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<BackendDelegateDataReferenceRef<'a>>
            for BackendDelegateDataReference
        {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: BackendDelegateDataReferenceRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    location: ::core::convert::TryInto::try_into(value.location()?)?,
                    index: ::core::convert::TryInto::try_into(value.index()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for BackendDelegateDataReferenceRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for BackendDelegateDataReferenceRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[BackendDelegateDataReferenceRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<BackendDelegateDataReference>>
            for BackendDelegateDataReference
        {
            type Value = ::planus::Offset<BackendDelegateDataReference>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<BackendDelegateDataReference>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for BackendDelegateDataReferenceRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[BackendDelegateDataReferenceRef]",
                        "read_as_root",
                        0,
                    )
                })
            }
        }

        /// The table `CompileSpec` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `CompileSpec` in the file `schema/program.fbs:186`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct CompileSpec {
            /// The field `key` in the table `CompileSpec`
            pub key: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `value` in the table `CompileSpec`
            pub value: ::core::option::Option<::planus::alloc::vec::Vec<u8>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for CompileSpec {
            fn default() -> Self {
                Self {
                    key: ::core::default::Default::default(),
                    value: ::core::default::Default::default(),
                }
            }
        }

        impl CompileSpec {
            /// Creates a [CompileSpecBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> CompileSpecBuilder<()> {
                CompileSpecBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_key: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                field_value: impl ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_key = field_key.prepare(builder);
                let prepared_value = field_value.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_key.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }
                if prepared_value.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u8]>>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_key) = prepared_key {
                            object_writer.write::<_, _, 4>(&prepared_key);
                        }
                        if let ::core::option::Option::Some(prepared_value) = prepared_value {
                            object_writer.write::<_, _, 4>(&prepared_value);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<CompileSpec>> for CompileSpec {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<CompileSpec> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<CompileSpec>> for CompileSpec {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<CompileSpec>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<CompileSpec> for CompileSpec {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<CompileSpec> {
                CompileSpec::create(builder, &self.key, &self.value)
            }
        }

        /// Builder for serializing an instance of the [CompileSpec] type.
        ///
        /// Can be created using the [CompileSpec::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct CompileSpecBuilder<State>(State);

        impl CompileSpecBuilder<()> {
            /// Setter for the [`key` field](CompileSpec#structfield.key).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn key<T0>(self, value: T0) -> CompileSpecBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                CompileSpecBuilder((value,))
            }

            /// Sets the [`key` field](CompileSpec#structfield.key) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn key_as_null(self) -> CompileSpecBuilder<((),)> {
                self.key(())
            }
        }

        impl<T0> CompileSpecBuilder<(T0,)> {
            /// Setter for the [`value` field](CompileSpec#structfield.value).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn value<T1>(self, value: T1) -> CompileSpecBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            {
                let (v0,) = self.0;
                CompileSpecBuilder((v0, value))
            }

            /// Sets the [`value` field](CompileSpec#structfield.value) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn value_as_null(self) -> CompileSpecBuilder<(T0, ())> {
                self.value(())
            }
        }

        impl<T0, T1> CompileSpecBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [CompileSpec].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<CompileSpec>
            where
                Self: ::planus::WriteAsOffset<CompileSpec>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAs<::planus::Offset<CompileSpec>> for CompileSpecBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<CompileSpec>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<CompileSpec> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAsOptional<::planus::Offset<CompileSpec>>
            for CompileSpecBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<CompileSpec>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<CompileSpec>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAsOffset<CompileSpec> for CompileSpecBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<CompileSpec> {
                let (v0, v1) = &self.0;
                CompileSpec::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [CompileSpec].
        #[derive(Copy, Clone)]
        pub struct CompileSpecRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> CompileSpecRef<'a> {
            /// Getter for the [`key` field](CompileSpec#structfield.key).
            #[inline]
            pub fn key(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "CompileSpec", "key")
            }

            /// Getter for the [`value` field](CompileSpec#structfield.value).
            #[inline]
            pub fn value(&self) -> ::planus::Result<::core::option::Option<&'a [u8]>> {
                self.0.access(1, "CompileSpec", "value")
            }
        }

        impl<'a> ::core::fmt::Debug for CompileSpecRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("CompileSpecRef");
                if let ::core::option::Option::Some(field_key) = self.key().transpose() {
                    f.field("key", &field_key);
                }
                if let ::core::option::Option::Some(field_value) = self.value().transpose() {
                    f.field("value", &field_value);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<CompileSpecRef<'a>> for CompileSpec {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: CompileSpecRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    key: value.key()?.map(::core::convert::Into::into),
                    value: value.value()?.map(|v| v.to_vec()),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for CompileSpecRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for CompileSpecRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[CompileSpecRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<CompileSpec>> for CompileSpec {
            type Value = ::planus::Offset<CompileSpec>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<CompileSpec>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for CompileSpecRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[CompileSpecRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `BackendDelegate` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `BackendDelegate` in the file `schema/program.fbs:191`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct BackendDelegate {
            /// The field `id` in the table `BackendDelegate`
            pub id: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `processed` in the table `BackendDelegate`
            pub processed: ::core::option::Option<
                ::planus::alloc::boxed::Box<self::BackendDelegateDataReference>,
            >,
            /// The field `compile_specs` in the table `BackendDelegate`
            pub compile_specs: ::core::option::Option<::planus::alloc::vec::Vec<self::CompileSpec>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for BackendDelegate {
            fn default() -> Self {
                Self {
                    id: ::core::default::Default::default(),
                    processed: ::core::default::Default::default(),
                    compile_specs: ::core::default::Default::default(),
                }
            }
        }

        impl BackendDelegate {
            /// Creates a [BackendDelegateBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> BackendDelegateBuilder<()> {
                BackendDelegateBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_id: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                field_processed: impl ::planus::WriteAsOptional<
                    ::planus::Offset<self::BackendDelegateDataReference>,
                >,
                field_compile_specs: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::CompileSpec>]>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_id = field_id.prepare(builder);
                let prepared_processed = field_processed.prepare(builder);
                let prepared_compile_specs = field_compile_specs.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<10> =
                    ::core::default::Default::default();
                if prepared_id.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }
                if prepared_processed.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<self::BackendDelegateDataReference>>(1);
                }
                if prepared_compile_specs.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::CompileSpec>]>>(2);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_id) = prepared_id {
                            object_writer.write::<_, _, 4>(&prepared_id);
                        }
                        if let ::core::option::Option::Some(prepared_processed) = prepared_processed
                        {
                            object_writer.write::<_, _, 4>(&prepared_processed);
                        }
                        if let ::core::option::Option::Some(prepared_compile_specs) =
                            prepared_compile_specs
                        {
                            object_writer.write::<_, _, 4>(&prepared_compile_specs);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<BackendDelegate>> for BackendDelegate {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegate> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<BackendDelegate>> for BackendDelegate {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BackendDelegate>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<BackendDelegate> for BackendDelegate {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegate> {
                BackendDelegate::create(builder, &self.id, &self.processed, &self.compile_specs)
            }
        }

        /// Builder for serializing an instance of the [BackendDelegate] type.
        ///
        /// Can be created using the [BackendDelegate::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct BackendDelegateBuilder<State>(State);

        impl BackendDelegateBuilder<()> {
            /// Setter for the [`id` field](BackendDelegate#structfield.id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn id<T0>(self, value: T0) -> BackendDelegateBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                BackendDelegateBuilder((value,))
            }

            /// Sets the [`id` field](BackendDelegate#structfield.id) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn id_as_null(self) -> BackendDelegateBuilder<((),)> {
                self.id(())
            }
        }

        impl<T0> BackendDelegateBuilder<(T0,)> {
            /// Setter for the [`processed` field](BackendDelegate#structfield.processed).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn processed<T1>(self, value: T1) -> BackendDelegateBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<self::BackendDelegateDataReference>>,
            {
                let (v0,) = self.0;
                BackendDelegateBuilder((v0, value))
            }

            /// Sets the [`processed` field](BackendDelegate#structfield.processed) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn processed_as_null(self) -> BackendDelegateBuilder<(T0, ())> {
                self.processed(())
            }
        }

        impl<T0, T1> BackendDelegateBuilder<(T0, T1)> {
            /// Setter for the [`compile_specs` field](BackendDelegate#structfield.compile_specs).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn compile_specs<T2>(self, value: T2) -> BackendDelegateBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::CompileSpec>]>,
                >,
            {
                let (v0, v1) = self.0;
                BackendDelegateBuilder((v0, v1, value))
            }

            /// Sets the [`compile_specs` field](BackendDelegate#structfield.compile_specs) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn compile_specs_as_null(self) -> BackendDelegateBuilder<(T0, T1, ())> {
                self.compile_specs(())
            }
        }

        impl<T0, T1, T2> BackendDelegateBuilder<(T0, T1, T2)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [BackendDelegate].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegate>
            where
                Self: ::planus::WriteAsOffset<BackendDelegate>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<self::BackendDelegateDataReference>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::CompileSpec>]>>,
            > ::planus::WriteAs<::planus::Offset<BackendDelegate>>
            for BackendDelegateBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<BackendDelegate>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegate> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<self::BackendDelegateDataReference>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::CompileSpec>]>>,
            > ::planus::WriteAsOptional<::planus::Offset<BackendDelegate>>
            for BackendDelegateBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<BackendDelegate>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BackendDelegate>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<self::BackendDelegateDataReference>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::CompileSpec>]>>,
            > ::planus::WriteAsOffset<BackendDelegate> for BackendDelegateBuilder<(T0, T1, T2)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegate> {
                let (v0, v1, v2) = &self.0;
                BackendDelegate::create(builder, v0, v1, v2)
            }
        }

        /// Reference to a deserialized [BackendDelegate].
        #[derive(Copy, Clone)]
        pub struct BackendDelegateRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> BackendDelegateRef<'a> {
            /// Getter for the [`id` field](BackendDelegate#structfield.id).
            #[inline]
            pub fn id(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "BackendDelegate", "id")
            }

            /// Getter for the [`processed` field](BackendDelegate#structfield.processed).
            #[inline]
            pub fn processed(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::BackendDelegateDataReferenceRef<'a>>>
            {
                self.0.access(1, "BackendDelegate", "processed")
            }

            /// Getter for the [`compile_specs` field](BackendDelegate#structfield.compile_specs).
            #[inline]
            pub fn compile_specs(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::CompileSpecRef<'a>>>,
                >,
            > {
                self.0.access(2, "BackendDelegate", "compile_specs")
            }
        }

        impl<'a> ::core::fmt::Debug for BackendDelegateRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("BackendDelegateRef");
                if let ::core::option::Option::Some(field_id) = self.id().transpose() {
                    f.field("id", &field_id);
                }
                if let ::core::option::Option::Some(field_processed) = self.processed().transpose()
                {
                    f.field("processed", &field_processed);
                }
                if let ::core::option::Option::Some(field_compile_specs) =
                    self.compile_specs().transpose()
                {
                    f.field("compile_specs", &field_compile_specs);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<BackendDelegateRef<'a>> for BackendDelegate {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: BackendDelegateRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    id: value.id()?.map(::core::convert::Into::into),
                    processed: if let ::core::option::Option::Some(processed) = value.processed()? {
                        ::core::option::Option::Some(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryInto::try_into(processed)?,
                        ))
                    } else {
                        ::core::option::Option::None
                    },
                    compile_specs: if let ::core::option::Option::Some(compile_specs) =
                        value.compile_specs()?
                    {
                        ::core::option::Option::Some(compile_specs.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for BackendDelegateRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for BackendDelegateRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[BackendDelegateRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<BackendDelegate>> for BackendDelegate {
            type Value = ::planus::Offset<BackendDelegate>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<BackendDelegate>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for BackendDelegateRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[BackendDelegateRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Chain` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Chain` in the file `schema/program.fbs:197`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Chain {
            /// The field `inputs` in the table `Chain`
            pub inputs: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
            /// The field `outputs` in the table `Chain`
            pub outputs: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
            /// The field `instructions` in the table `Chain`
            pub instructions: ::core::option::Option<::planus::alloc::vec::Vec<self::Instruction>>,
            /// The field `stacktrace` in the table `Chain`
            pub stacktrace: ::core::option::Option<::planus::alloc::vec::Vec<self::FrameList>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Chain {
            fn default() -> Self {
                Self {
                    inputs: ::core::default::Default::default(),
                    outputs: ::core::default::Default::default(),
                    instructions: ::core::default::Default::default(),
                    stacktrace: ::core::default::Default::default(),
                }
            }
        }

        impl Chain {
            /// Creates a [ChainBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> ChainBuilder<()> {
                ChainBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_inputs: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                field_outputs: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                field_instructions: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::Instruction>]>,
                >,
                field_stacktrace: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::FrameList>]>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_inputs = field_inputs.prepare(builder);
                let prepared_outputs = field_outputs.prepare(builder);
                let prepared_instructions = field_instructions.prepare(builder);
                let prepared_stacktrace = field_stacktrace.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<12> =
                    ::core::default::Default::default();
                if prepared_inputs.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(0);
                }
                if prepared_outputs.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(1);
                }
                if prepared_instructions.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::Instruction>]>>(2);
                }
                if prepared_stacktrace.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::FrameList>]>>(3);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_inputs) = prepared_inputs {
                            object_writer.write::<_, _, 4>(&prepared_inputs);
                        }
                        if let ::core::option::Option::Some(prepared_outputs) = prepared_outputs {
                            object_writer.write::<_, _, 4>(&prepared_outputs);
                        }
                        if let ::core::option::Option::Some(prepared_instructions) =
                            prepared_instructions
                        {
                            object_writer.write::<_, _, 4>(&prepared_instructions);
                        }
                        if let ::core::option::Option::Some(prepared_stacktrace) =
                            prepared_stacktrace
                        {
                            object_writer.write::<_, _, 4>(&prepared_stacktrace);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Chain>> for Chain {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Chain> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Chain>> for Chain {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Chain>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Chain> for Chain {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Chain> {
                Chain::create(
                    builder,
                    &self.inputs,
                    &self.outputs,
                    &self.instructions,
                    &self.stacktrace,
                )
            }
        }

        /// Builder for serializing an instance of the [Chain] type.
        ///
        /// Can be created using the [Chain::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct ChainBuilder<State>(State);

        impl ChainBuilder<()> {
            /// Setter for the [`inputs` field](Chain#structfield.inputs).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn inputs<T0>(self, value: T0) -> ChainBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                ChainBuilder((value,))
            }

            /// Sets the [`inputs` field](Chain#structfield.inputs) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn inputs_as_null(self) -> ChainBuilder<((),)> {
                self.inputs(())
            }
        }

        impl<T0> ChainBuilder<(T0,)> {
            /// Setter for the [`outputs` field](Chain#structfield.outputs).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn outputs<T1>(self, value: T1) -> ChainBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                let (v0,) = self.0;
                ChainBuilder((v0, value))
            }

            /// Sets the [`outputs` field](Chain#structfield.outputs) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn outputs_as_null(self) -> ChainBuilder<(T0, ())> {
                self.outputs(())
            }
        }

        impl<T0, T1> ChainBuilder<(T0, T1)> {
            /// Setter for the [`instructions` field](Chain#structfield.instructions).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn instructions<T2>(self, value: T2) -> ChainBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::Instruction>]>,
                >,
            {
                let (v0, v1) = self.0;
                ChainBuilder((v0, v1, value))
            }

            /// Sets the [`instructions` field](Chain#structfield.instructions) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn instructions_as_null(self) -> ChainBuilder<(T0, T1, ())> {
                self.instructions(())
            }
        }

        impl<T0, T1, T2> ChainBuilder<(T0, T1, T2)> {
            /// Setter for the [`stacktrace` field](Chain#structfield.stacktrace).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn stacktrace<T3>(self, value: T3) -> ChainBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::FrameList>]>,
                >,
            {
                let (v0, v1, v2) = self.0;
                ChainBuilder((v0, v1, v2, value))
            }

            /// Sets the [`stacktrace` field](Chain#structfield.stacktrace) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn stacktrace_as_null(self) -> ChainBuilder<(T0, T1, T2, ())> {
                self.stacktrace(())
            }
        }

        impl<T0, T1, T2, T3> ChainBuilder<(T0, T1, T2, T3)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Chain].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Chain>
            where
                Self: ::planus::WriteAsOffset<Chain>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Instruction>]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::FrameList>]>>,
            > ::planus::WriteAs<::planus::Offset<Chain>> for ChainBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<Chain>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Chain> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Instruction>]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::FrameList>]>>,
            > ::planus::WriteAsOptional<::planus::Offset<Chain>>
            for ChainBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<Chain>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Chain>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Instruction>]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::FrameList>]>>,
            > ::planus::WriteAsOffset<Chain> for ChainBuilder<(T0, T1, T2, T3)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Chain> {
                let (v0, v1, v2, v3) = &self.0;
                Chain::create(builder, v0, v1, v2, v3)
            }
        }

        /// Reference to a deserialized [Chain].
        #[derive(Copy, Clone)]
        pub struct ChainRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> ChainRef<'a> {
            /// Getter for the [`inputs` field](Chain#structfield.inputs).
            #[inline]
            pub fn inputs(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(0, "Chain", "inputs")
            }

            /// Getter for the [`outputs` field](Chain#structfield.outputs).
            #[inline]
            pub fn outputs(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(1, "Chain", "outputs")
            }

            /// Getter for the [`instructions` field](Chain#structfield.instructions).
            #[inline]
            pub fn instructions(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::InstructionRef<'a>>>,
                >,
            > {
                self.0.access(2, "Chain", "instructions")
            }

            /// Getter for the [`stacktrace` field](Chain#structfield.stacktrace).
            #[inline]
            pub fn stacktrace(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::FrameListRef<'a>>>,
                >,
            > {
                self.0.access(3, "Chain", "stacktrace")
            }
        }

        impl<'a> ::core::fmt::Debug for ChainRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("ChainRef");
                if let ::core::option::Option::Some(field_inputs) = self.inputs().transpose() {
                    f.field("inputs", &field_inputs);
                }
                if let ::core::option::Option::Some(field_outputs) = self.outputs().transpose() {
                    f.field("outputs", &field_outputs);
                }
                if let ::core::option::Option::Some(field_instructions) =
                    self.instructions().transpose()
                {
                    f.field("instructions", &field_instructions);
                }
                if let ::core::option::Option::Some(field_stacktrace) =
                    self.stacktrace().transpose()
                {
                    f.field("stacktrace", &field_stacktrace);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<ChainRef<'a>> for Chain {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: ChainRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    inputs: if let ::core::option::Option::Some(inputs) = value.inputs()? {
                        ::core::option::Option::Some(inputs.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    outputs: if let ::core::option::Option::Some(outputs) = value.outputs()? {
                        ::core::option::Option::Some(outputs.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    instructions: if let ::core::option::Option::Some(instructions) =
                        value.instructions()?
                    {
                        ::core::option::Option::Some(instructions.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    stacktrace: if let ::core::option::Option::Some(stacktrace) =
                        value.stacktrace()?
                    {
                        ::core::option::Option::Some(stacktrace.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for ChainRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for ChainRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[ChainRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Chain>> for Chain {
            type Value = ::planus::Offset<Chain>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Chain>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for ChainRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[ChainRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `ExecutionPlan` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `ExecutionPlan` in the file `schema/program.fbs:204`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct ExecutionPlan {
            /// The field `name` in the table `ExecutionPlan`
            pub name: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `container_meta_type` in the table `ExecutionPlan`
            pub container_meta_type:
                ::core::option::Option<::planus::alloc::boxed::Box<self::ContainerMetadata>>,
            /// The field `values` in the table `ExecutionPlan`
            pub values: ::core::option::Option<::planus::alloc::vec::Vec<self::EValue>>,
            /// The field `inputs` in the table `ExecutionPlan`
            pub inputs: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
            /// The field `outputs` in the table `ExecutionPlan`
            pub outputs: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
            /// The field `chains` in the table `ExecutionPlan`
            pub chains: ::core::option::Option<::planus::alloc::vec::Vec<self::Chain>>,
            /// The field `operators` in the table `ExecutionPlan`
            pub operators: ::core::option::Option<::planus::alloc::vec::Vec<self::Operator>>,
            /// The field `delegates` in the table `ExecutionPlan`
            pub delegates: ::core::option::Option<::planus::alloc::vec::Vec<self::BackendDelegate>>,
            /// The field `non_const_buffer_sizes` in the table `ExecutionPlan`
            pub non_const_buffer_sizes: ::core::option::Option<::planus::alloc::vec::Vec<i64>>,
            /// The field `non_const_buffer_device` in the table `ExecutionPlan`
            pub non_const_buffer_device:
                ::core::option::Option<::planus::alloc::vec::Vec<self::NonConstBufferDevice>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for ExecutionPlan {
            fn default() -> Self {
                Self {
                    name: ::core::default::Default::default(),
                    container_meta_type: ::core::default::Default::default(),
                    values: ::core::default::Default::default(),
                    inputs: ::core::default::Default::default(),
                    outputs: ::core::default::Default::default(),
                    chains: ::core::default::Default::default(),
                    operators: ::core::default::Default::default(),
                    delegates: ::core::default::Default::default(),
                    non_const_buffer_sizes: ::core::default::Default::default(),
                    non_const_buffer_device: ::core::default::Default::default(),
                }
            }
        }

        impl ExecutionPlan {
            /// Creates a [ExecutionPlanBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> ExecutionPlanBuilder<()> {
                ExecutionPlanBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_name: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                field_container_meta_type: impl ::planus::WriteAsOptional<
                    ::planus::Offset<self::ContainerMetadata>,
                >,
                field_values: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::EValue>]>,
                >,
                field_inputs: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                field_outputs: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                field_chains: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::Chain>]>,
                >,
                field_operators: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::Operator>]>,
                >,
                field_delegates: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BackendDelegate>]>,
                >,
                field_non_const_buffer_sizes: impl ::planus::WriteAsOptional<::planus::Offset<[i64]>>,
                field_non_const_buffer_device: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::NonConstBufferDevice>]>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_name = field_name.prepare(builder);
                let prepared_container_meta_type = field_container_meta_type.prepare(builder);
                let prepared_values = field_values.prepare(builder);
                let prepared_inputs = field_inputs.prepare(builder);
                let prepared_outputs = field_outputs.prepare(builder);
                let prepared_chains = field_chains.prepare(builder);
                let prepared_operators = field_operators.prepare(builder);
                let prepared_delegates = field_delegates.prepare(builder);
                let prepared_non_const_buffer_sizes = field_non_const_buffer_sizes.prepare(builder);
                let prepared_non_const_buffer_device =
                    field_non_const_buffer_device.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<24> =
                    ::core::default::Default::default();
                if prepared_name.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }
                if prepared_container_meta_type.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::ContainerMetadata>>(1);
                }
                if prepared_values.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::EValue>]>>(2);
                }
                if prepared_inputs.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(3);
                }
                if prepared_outputs.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(4);
                }
                if prepared_chains.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::Chain>]>>(5);
                }
                if prepared_operators.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::Operator>]>>(6);
                }
                if prepared_delegates.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::BackendDelegate>]>>(
                            7,
                        );
                }
                if prepared_non_const_buffer_sizes.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i64]>>(8);
                }
                if prepared_non_const_buffer_device.is_some() {
                    table_writer.write_entry::<::planus::Offset<[::planus::Offset<self::NonConstBufferDevice>]>>(9);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_name) = prepared_name {
                            object_writer.write::<_, _, 4>(&prepared_name);
                        }
                        if let ::core::option::Option::Some(prepared_container_meta_type) =
                            prepared_container_meta_type
                        {
                            object_writer.write::<_, _, 4>(&prepared_container_meta_type);
                        }
                        if let ::core::option::Option::Some(prepared_values) = prepared_values {
                            object_writer.write::<_, _, 4>(&prepared_values);
                        }
                        if let ::core::option::Option::Some(prepared_inputs) = prepared_inputs {
                            object_writer.write::<_, _, 4>(&prepared_inputs);
                        }
                        if let ::core::option::Option::Some(prepared_outputs) = prepared_outputs {
                            object_writer.write::<_, _, 4>(&prepared_outputs);
                        }
                        if let ::core::option::Option::Some(prepared_chains) = prepared_chains {
                            object_writer.write::<_, _, 4>(&prepared_chains);
                        }
                        if let ::core::option::Option::Some(prepared_operators) = prepared_operators
                        {
                            object_writer.write::<_, _, 4>(&prepared_operators);
                        }
                        if let ::core::option::Option::Some(prepared_delegates) = prepared_delegates
                        {
                            object_writer.write::<_, _, 4>(&prepared_delegates);
                        }
                        if let ::core::option::Option::Some(prepared_non_const_buffer_sizes) =
                            prepared_non_const_buffer_sizes
                        {
                            object_writer.write::<_, _, 4>(&prepared_non_const_buffer_sizes);
                        }
                        if let ::core::option::Option::Some(prepared_non_const_buffer_device) =
                            prepared_non_const_buffer_device
                        {
                            object_writer.write::<_, _, 4>(&prepared_non_const_buffer_device);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<ExecutionPlan>> for ExecutionPlan {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<ExecutionPlan> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<ExecutionPlan>> for ExecutionPlan {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<ExecutionPlan>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<ExecutionPlan> for ExecutionPlan {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<ExecutionPlan> {
                ExecutionPlan::create(
                    builder,
                    &self.name,
                    &self.container_meta_type,
                    &self.values,
                    &self.inputs,
                    &self.outputs,
                    &self.chains,
                    &self.operators,
                    &self.delegates,
                    &self.non_const_buffer_sizes,
                    &self.non_const_buffer_device,
                )
            }
        }

        /// Builder for serializing an instance of the [ExecutionPlan] type.
        ///
        /// Can be created using the [ExecutionPlan::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct ExecutionPlanBuilder<State>(State);

        impl ExecutionPlanBuilder<()> {
            /// Setter for the [`name` field](ExecutionPlan#structfield.name).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn name<T0>(self, value: T0) -> ExecutionPlanBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                ExecutionPlanBuilder((value,))
            }

            /// Sets the [`name` field](ExecutionPlan#structfield.name) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn name_as_null(self) -> ExecutionPlanBuilder<((),)> {
                self.name(())
            }
        }

        impl<T0> ExecutionPlanBuilder<(T0,)> {
            /// Setter for the [`container_meta_type` field](ExecutionPlan#structfield.container_meta_type).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn container_meta_type<T1>(self, value: T1) -> ExecutionPlanBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<self::ContainerMetadata>>,
            {
                let (v0,) = self.0;
                ExecutionPlanBuilder((v0, value))
            }

            /// Sets the [`container_meta_type` field](ExecutionPlan#structfield.container_meta_type) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn container_meta_type_as_null(self) -> ExecutionPlanBuilder<(T0, ())> {
                self.container_meta_type(())
            }
        }

        impl<T0, T1> ExecutionPlanBuilder<(T0, T1)> {
            /// Setter for the [`values` field](ExecutionPlan#structfield.values).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn values<T2>(self, value: T2) -> ExecutionPlanBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::EValue>]>>,
            {
                let (v0, v1) = self.0;
                ExecutionPlanBuilder((v0, v1, value))
            }

            /// Sets the [`values` field](ExecutionPlan#structfield.values) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn values_as_null(self) -> ExecutionPlanBuilder<(T0, T1, ())> {
                self.values(())
            }
        }

        impl<T0, T1, T2> ExecutionPlanBuilder<(T0, T1, T2)> {
            /// Setter for the [`inputs` field](ExecutionPlan#structfield.inputs).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn inputs<T3>(self, value: T3) -> ExecutionPlanBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                let (v0, v1, v2) = self.0;
                ExecutionPlanBuilder((v0, v1, v2, value))
            }

            /// Sets the [`inputs` field](ExecutionPlan#structfield.inputs) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn inputs_as_null(self) -> ExecutionPlanBuilder<(T0, T1, T2, ())> {
                self.inputs(())
            }
        }

        impl<T0, T1, T2, T3> ExecutionPlanBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`outputs` field](ExecutionPlan#structfield.outputs).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn outputs<T4>(self, value: T4) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                let (v0, v1, v2, v3) = self.0;
                ExecutionPlanBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`outputs` field](ExecutionPlan#structfield.outputs) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn outputs_as_null(self) -> ExecutionPlanBuilder<(T0, T1, T2, T3, ())> {
                self.outputs(())
            }
        }

        impl<T0, T1, T2, T3, T4> ExecutionPlanBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`chains` field](ExecutionPlan#structfield.chains).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn chains<T5>(self, value: T5) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Chain>]>>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                ExecutionPlanBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`chains` field](ExecutionPlan#structfield.chains) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn chains_as_null(self) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, ())> {
                self.chains(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Setter for the [`operators` field](ExecutionPlan#structfield.operators).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn operators<T6>(
                self,
                value: T6,
            ) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6)>
            where
                T6: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Operator>]>>,
            {
                let (v0, v1, v2, v3, v4, v5) = self.0;
                ExecutionPlanBuilder((v0, v1, v2, v3, v4, v5, value))
            }

            /// Sets the [`operators` field](ExecutionPlan#structfield.operators) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn operators_as_null(self) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, ())> {
                self.operators(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6)> {
            /// Setter for the [`delegates` field](ExecutionPlan#structfield.delegates).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn delegates<T7>(
                self,
                value: T7,
            ) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
            where
                T7: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BackendDelegate>]>,
                >,
            {
                let (v0, v1, v2, v3, v4, v5, v6) = self.0;
                ExecutionPlanBuilder((v0, v1, v2, v3, v4, v5, v6, value))
            }

            /// Sets the [`delegates` field](ExecutionPlan#structfield.delegates) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn delegates_as_null(
                self,
            ) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, ())> {
                self.delegates(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)> {
            /// Setter for the [`non_const_buffer_sizes` field](ExecutionPlan#structfield.non_const_buffer_sizes).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn non_const_buffer_sizes<T8>(
                self,
                value: T8,
            ) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
            where
                T8: ::planus::WriteAsOptional<::planus::Offset<[i64]>>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7) = self.0;
                ExecutionPlanBuilder((v0, v1, v2, v3, v4, v5, v6, v7, value))
            }

            /// Sets the [`non_const_buffer_sizes` field](ExecutionPlan#structfield.non_const_buffer_sizes) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn non_const_buffer_sizes_as_null(
                self,
            ) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, ())> {
                self.non_const_buffer_sizes(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8>
            ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
        {
            /// Setter for the [`non_const_buffer_device` field](ExecutionPlan#structfield.non_const_buffer_device).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn non_const_buffer_device<T9>(
                self,
                value: T9,
            ) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
            where
                T9: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::NonConstBufferDevice>]>,
                >,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8) = self.0;
                ExecutionPlanBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, value))
            }

            /// Sets the [`non_const_buffer_device` field](ExecutionPlan#structfield.non_const_buffer_device) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn non_const_buffer_device_as_null(
                self,
            ) -> ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, ())> {
                self.non_const_buffer_device(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9>
            ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [ExecutionPlan].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<ExecutionPlan>
            where
                Self: ::planus::WriteAsOffset<ExecutionPlan>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<self::ContainerMetadata>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::EValue>]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T4: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T5: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Chain>]>>,
                T6: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Operator>]>>,
                T7: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BackendDelegate>]>,
                >,
                T8: ::planus::WriteAsOptional<::planus::Offset<[i64]>>,
                T9: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::NonConstBufferDevice>]>,
                >,
            > ::planus::WriteAs<::planus::Offset<ExecutionPlan>>
            for ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            type Prepared = ::planus::Offset<ExecutionPlan>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<ExecutionPlan> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<self::ContainerMetadata>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::EValue>]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T4: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T5: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Chain>]>>,
                T6: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Operator>]>>,
                T7: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BackendDelegate>]>,
                >,
                T8: ::planus::WriteAsOptional<::planus::Offset<[i64]>>,
                T9: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::NonConstBufferDevice>]>,
                >,
            > ::planus::WriteAsOptional<::planus::Offset<ExecutionPlan>>
            for ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            type Prepared = ::planus::Offset<ExecutionPlan>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<ExecutionPlan>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<self::ContainerMetadata>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::EValue>]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T4: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T5: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Chain>]>>,
                T6: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Operator>]>>,
                T7: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BackendDelegate>]>,
                >,
                T8: ::planus::WriteAsOptional<::planus::Offset<[i64]>>,
                T9: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::NonConstBufferDevice>]>,
                >,
            > ::planus::WriteAsOffset<ExecutionPlan>
            for ExecutionPlanBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<ExecutionPlan> {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9) = &self.0;
                ExecutionPlan::create(builder, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9)
            }
        }

        /// Reference to a deserialized [ExecutionPlan].
        #[derive(Copy, Clone)]
        pub struct ExecutionPlanRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> ExecutionPlanRef<'a> {
            /// Getter for the [`name` field](ExecutionPlan#structfield.name).
            #[inline]
            pub fn name(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "ExecutionPlan", "name")
            }

            /// Getter for the [`container_meta_type` field](ExecutionPlan#structfield.container_meta_type).
            #[inline]
            pub fn container_meta_type(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::ContainerMetadataRef<'a>>>
            {
                self.0.access(1, "ExecutionPlan", "container_meta_type")
            }

            /// Getter for the [`values` field](ExecutionPlan#structfield.values).
            #[inline]
            pub fn values(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<::planus::Vector<'a, ::planus::Result<self::EValueRef<'a>>>>,
            > {
                self.0.access(2, "ExecutionPlan", "values")
            }

            /// Getter for the [`inputs` field](ExecutionPlan#structfield.inputs).
            #[inline]
            pub fn inputs(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(3, "ExecutionPlan", "inputs")
            }

            /// Getter for the [`outputs` field](ExecutionPlan#structfield.outputs).
            #[inline]
            pub fn outputs(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(4, "ExecutionPlan", "outputs")
            }

            /// Getter for the [`chains` field](ExecutionPlan#structfield.chains).
            #[inline]
            pub fn chains(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<::planus::Vector<'a, ::planus::Result<self::ChainRef<'a>>>>,
            > {
                self.0.access(5, "ExecutionPlan", "chains")
            }

            /// Getter for the [`operators` field](ExecutionPlan#structfield.operators).
            #[inline]
            pub fn operators(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::OperatorRef<'a>>>,
                >,
            > {
                self.0.access(6, "ExecutionPlan", "operators")
            }

            /// Getter for the [`delegates` field](ExecutionPlan#structfield.delegates).
            #[inline]
            pub fn delegates(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::BackendDelegateRef<'a>>>,
                >,
            > {
                self.0.access(7, "ExecutionPlan", "delegates")
            }

            /// Getter for the [`non_const_buffer_sizes` field](ExecutionPlan#structfield.non_const_buffer_sizes).
            #[inline]
            pub fn non_const_buffer_sizes(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i64>>> {
                self.0.access(8, "ExecutionPlan", "non_const_buffer_sizes")
            }

            /// Getter for the [`non_const_buffer_device` field](ExecutionPlan#structfield.non_const_buffer_device).
            #[inline]
            pub fn non_const_buffer_device(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::NonConstBufferDeviceRef<'a>>>,
                >,
            > {
                self.0.access(9, "ExecutionPlan", "non_const_buffer_device")
            }
        }

        impl<'a> ::core::fmt::Debug for ExecutionPlanRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("ExecutionPlanRef");
                if let ::core::option::Option::Some(field_name) = self.name().transpose() {
                    f.field("name", &field_name);
                }
                if let ::core::option::Option::Some(field_container_meta_type) =
                    self.container_meta_type().transpose()
                {
                    f.field("container_meta_type", &field_container_meta_type);
                }
                if let ::core::option::Option::Some(field_values) = self.values().transpose() {
                    f.field("values", &field_values);
                }
                if let ::core::option::Option::Some(field_inputs) = self.inputs().transpose() {
                    f.field("inputs", &field_inputs);
                }
                if let ::core::option::Option::Some(field_outputs) = self.outputs().transpose() {
                    f.field("outputs", &field_outputs);
                }
                if let ::core::option::Option::Some(field_chains) = self.chains().transpose() {
                    f.field("chains", &field_chains);
                }
                if let ::core::option::Option::Some(field_operators) = self.operators().transpose()
                {
                    f.field("operators", &field_operators);
                }
                if let ::core::option::Option::Some(field_delegates) = self.delegates().transpose()
                {
                    f.field("delegates", &field_delegates);
                }
                if let ::core::option::Option::Some(field_non_const_buffer_sizes) =
                    self.non_const_buffer_sizes().transpose()
                {
                    f.field("non_const_buffer_sizes", &field_non_const_buffer_sizes);
                }
                if let ::core::option::Option::Some(field_non_const_buffer_device) =
                    self.non_const_buffer_device().transpose()
                {
                    f.field("non_const_buffer_device", &field_non_const_buffer_device);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<ExecutionPlanRef<'a>> for ExecutionPlan {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: ExecutionPlanRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    name: value.name()?.map(::core::convert::Into::into),
                    container_meta_type: if let ::core::option::Option::Some(container_meta_type) =
                        value.container_meta_type()?
                    {
                        ::core::option::Option::Some(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryInto::try_into(container_meta_type)?,
                        ))
                    } else {
                        ::core::option::Option::None
                    },
                    values: if let ::core::option::Option::Some(values) = value.values()? {
                        ::core::option::Option::Some(values.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    inputs: if let ::core::option::Option::Some(inputs) = value.inputs()? {
                        ::core::option::Option::Some(inputs.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    outputs: if let ::core::option::Option::Some(outputs) = value.outputs()? {
                        ::core::option::Option::Some(outputs.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    chains: if let ::core::option::Option::Some(chains) = value.chains()? {
                        ::core::option::Option::Some(chains.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    operators: if let ::core::option::Option::Some(operators) = value.operators()? {
                        ::core::option::Option::Some(operators.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    delegates: if let ::core::option::Option::Some(delegates) = value.delegates()? {
                        ::core::option::Option::Some(delegates.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    non_const_buffer_sizes: if let ::core::option::Option::Some(
                        non_const_buffer_sizes,
                    ) = value.non_const_buffer_sizes()?
                    {
                        ::core::option::Option::Some(non_const_buffer_sizes.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    non_const_buffer_device: if let ::core::option::Option::Some(
                        non_const_buffer_device,
                    ) = value.non_const_buffer_device()?
                    {
                        ::core::option::Option::Some(non_const_buffer_device.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for ExecutionPlanRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for ExecutionPlanRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[ExecutionPlanRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<ExecutionPlan>> for ExecutionPlan {
            type Value = ::planus::Offset<ExecutionPlan>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<ExecutionPlan>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for ExecutionPlanRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[ExecutionPlanRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `NonConstBufferDevice` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `NonConstBufferDevice` in the file `schema/program.fbs:218`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct NonConstBufferDevice {
            /// The field `buffer_idx` in the table `NonConstBufferDevice`
            pub buffer_idx: i32,
            /// The field `device_type` in the table `NonConstBufferDevice`
            pub device_type: self::DeviceType,
            /// The field `device_index` in the table `NonConstBufferDevice`
            pub device_index: i8,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for NonConstBufferDevice {
            fn default() -> Self {
                Self {
                    buffer_idx: 0,
                    device_type: self::DeviceType::Cpu,
                    device_index: 0,
                }
            }
        }

        impl NonConstBufferDevice {
            /// Creates a [NonConstBufferDeviceBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> NonConstBufferDeviceBuilder<()> {
                NonConstBufferDeviceBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_buffer_idx: impl ::planus::WriteAsDefault<i32, i32>,
                field_device_type: impl ::planus::WriteAsDefault<self::DeviceType, self::DeviceType>,
                field_device_index: impl ::planus::WriteAsDefault<i8, i8>,
            ) -> ::planus::Offset<Self> {
                let prepared_buffer_idx = field_buffer_idx.prepare(builder, &0);
                let prepared_device_type =
                    field_device_type.prepare(builder, &self::DeviceType::Cpu);
                let prepared_device_index = field_device_index.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<10> =
                    ::core::default::Default::default();
                if prepared_buffer_idx.is_some() {
                    table_writer.write_entry::<i32>(0);
                }
                if prepared_device_type.is_some() {
                    table_writer.write_entry::<self::DeviceType>(1);
                }
                if prepared_device_index.is_some() {
                    table_writer.write_entry::<i8>(2);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_buffer_idx) =
                            prepared_buffer_idx
                        {
                            object_writer.write::<_, _, 4>(&prepared_buffer_idx);
                        }
                        if let ::core::option::Option::Some(prepared_device_type) =
                            prepared_device_type
                        {
                            object_writer.write::<_, _, 1>(&prepared_device_type);
                        }
                        if let ::core::option::Option::Some(prepared_device_index) =
                            prepared_device_index
                        {
                            object_writer.write::<_, _, 1>(&prepared_device_index);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<NonConstBufferDevice>> for NonConstBufferDevice {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<NonConstBufferDevice> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<NonConstBufferDevice>> for NonConstBufferDevice {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<NonConstBufferDevice>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<NonConstBufferDevice> for NonConstBufferDevice {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<NonConstBufferDevice> {
                NonConstBufferDevice::create(
                    builder,
                    self.buffer_idx,
                    self.device_type,
                    self.device_index,
                )
            }
        }

        /// Builder for serializing an instance of the [NonConstBufferDevice] type.
        ///
        /// Can be created using the [NonConstBufferDevice::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct NonConstBufferDeviceBuilder<State>(State);

        impl NonConstBufferDeviceBuilder<()> {
            /// Setter for the [`buffer_idx` field](NonConstBufferDevice#structfield.buffer_idx).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn buffer_idx<T0>(self, value: T0) -> NonConstBufferDeviceBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<i32, i32>,
            {
                NonConstBufferDeviceBuilder((value,))
            }

            /// Sets the [`buffer_idx` field](NonConstBufferDevice#structfield.buffer_idx) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn buffer_idx_as_default(
                self,
            ) -> NonConstBufferDeviceBuilder<(::planus::DefaultValue,)> {
                self.buffer_idx(::planus::DefaultValue)
            }
        }

        impl<T0> NonConstBufferDeviceBuilder<(T0,)> {
            /// Setter for the [`device_type` field](NonConstBufferDevice#structfield.device_type).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn device_type<T1>(self, value: T1) -> NonConstBufferDeviceBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<self::DeviceType, self::DeviceType>,
            {
                let (v0,) = self.0;
                NonConstBufferDeviceBuilder((v0, value))
            }

            /// Sets the [`device_type` field](NonConstBufferDevice#structfield.device_type) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn device_type_as_default(
                self,
            ) -> NonConstBufferDeviceBuilder<(T0, ::planus::DefaultValue)> {
                self.device_type(::planus::DefaultValue)
            }
        }

        impl<T0, T1> NonConstBufferDeviceBuilder<(T0, T1)> {
            /// Setter for the [`device_index` field](NonConstBufferDevice#structfield.device_index).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn device_index<T2>(self, value: T2) -> NonConstBufferDeviceBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<i8, i8>,
            {
                let (v0, v1) = self.0;
                NonConstBufferDeviceBuilder((v0, v1, value))
            }

            /// Sets the [`device_index` field](NonConstBufferDevice#structfield.device_index) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn device_index_as_default(
                self,
            ) -> NonConstBufferDeviceBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.device_index(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> NonConstBufferDeviceBuilder<(T0, T1, T2)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [NonConstBufferDevice].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<NonConstBufferDevice>
            where
                Self: ::planus::WriteAsOffset<NonConstBufferDevice>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<i32, i32>,
                T1: ::planus::WriteAsDefault<self::DeviceType, self::DeviceType>,
                T2: ::planus::WriteAsDefault<i8, i8>,
            > ::planus::WriteAs<::planus::Offset<NonConstBufferDevice>>
            for NonConstBufferDeviceBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<NonConstBufferDevice>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<NonConstBufferDevice> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<i32, i32>,
                T1: ::planus::WriteAsDefault<self::DeviceType, self::DeviceType>,
                T2: ::planus::WriteAsDefault<i8, i8>,
            > ::planus::WriteAsOptional<::planus::Offset<NonConstBufferDevice>>
            for NonConstBufferDeviceBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<NonConstBufferDevice>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<NonConstBufferDevice>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<i32, i32>,
                T1: ::planus::WriteAsDefault<self::DeviceType, self::DeviceType>,
                T2: ::planus::WriteAsDefault<i8, i8>,
            > ::planus::WriteAsOffset<NonConstBufferDevice>
            for NonConstBufferDeviceBuilder<(T0, T1, T2)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<NonConstBufferDevice> {
                let (v0, v1, v2) = &self.0;
                NonConstBufferDevice::create(builder, v0, v1, v2)
            }
        }

        /// Reference to a deserialized [NonConstBufferDevice].
        #[derive(Copy, Clone)]
        pub struct NonConstBufferDeviceRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> NonConstBufferDeviceRef<'a> {
            /// Getter for the [`buffer_idx` field](NonConstBufferDevice#structfield.buffer_idx).
            #[inline]
            pub fn buffer_idx(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "NonConstBufferDevice", "buffer_idx")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`device_type` field](NonConstBufferDevice#structfield.device_type).
            #[inline]
            pub fn device_type(&self) -> ::planus::Result<self::DeviceType> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "NonConstBufferDevice", "device_type")?
                        .unwrap_or(self::DeviceType::Cpu),
                )
            }

            /// Getter for the [`device_index` field](NonConstBufferDevice#structfield.device_index).
            #[inline]
            pub fn device_index(&self) -> ::planus::Result<i8> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "NonConstBufferDevice", "device_index")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for NonConstBufferDeviceRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("NonConstBufferDeviceRef");
                f.field("buffer_idx", &self.buffer_idx());
                f.field("device_type", &self.device_type());
                f.field("device_index", &self.device_index());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<NonConstBufferDeviceRef<'a>> for NonConstBufferDevice {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: NonConstBufferDeviceRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    buffer_idx: ::core::convert::TryInto::try_into(value.buffer_idx()?)?,
                    device_type: ::core::convert::TryInto::try_into(value.device_type()?)?,
                    device_index: ::core::convert::TryInto::try_into(value.device_index()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for NonConstBufferDeviceRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for NonConstBufferDeviceRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[NonConstBufferDeviceRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<NonConstBufferDevice>> for NonConstBufferDevice {
            type Value = ::planus::Offset<NonConstBufferDevice>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<NonConstBufferDevice>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for NonConstBufferDeviceRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[NonConstBufferDeviceRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Buffer` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Buffer` in the file `schema/program.fbs:226`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Buffer {
            /// The field `storage` in the table `Buffer`
            pub storage: ::core::option::Option<::planus::alloc::vec::Vec<u8>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Buffer {
            fn default() -> Self {
                Self {
                    storage: ::core::default::Default::default(),
                }
            }
        }

        impl Buffer {
            /// Creates a [BufferBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> BufferBuilder<()> {
                BufferBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_storage: impl ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_storage = field_storage.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_storage.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u8]>>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_storage) = prepared_storage {
                            object_writer.write::<_, _, 4>(&prepared_storage);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Buffer>> for Buffer {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Buffer> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Buffer>> for Buffer {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Buffer>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Buffer> for Buffer {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Buffer> {
                Buffer::create(builder, &self.storage)
            }
        }

        /// Builder for serializing an instance of the [Buffer] type.
        ///
        /// Can be created using the [Buffer::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct BufferBuilder<State>(State);

        impl BufferBuilder<()> {
            /// Setter for the [`storage` field](Buffer#structfield.storage).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn storage<T0>(self, value: T0) -> BufferBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            {
                BufferBuilder((value,))
            }

            /// Sets the [`storage` field](Buffer#structfield.storage) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn storage_as_null(self) -> BufferBuilder<((),)> {
                self.storage(())
            }
        }

        impl<T0> BufferBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Buffer].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Buffer>
            where
                Self: ::planus::WriteAsOffset<Buffer>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[u8]>>>
            ::planus::WriteAs<::planus::Offset<Buffer>> for BufferBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Buffer>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Buffer> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[u8]>>>
            ::planus::WriteAsOptional<::planus::Offset<Buffer>> for BufferBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Buffer>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Buffer>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[u8]>>> ::planus::WriteAsOffset<Buffer>
            for BufferBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Buffer> {
                let (v0,) = &self.0;
                Buffer::create(builder, v0)
            }
        }

        /// Reference to a deserialized [Buffer].
        #[derive(Copy, Clone)]
        pub struct BufferRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> BufferRef<'a> {
            /// Getter for the [`storage` field](Buffer#structfield.storage).
            #[inline]
            pub fn storage(&self) -> ::planus::Result<::core::option::Option<&'a [u8]>> {
                self.0.access(0, "Buffer", "storage")
            }
        }

        impl<'a> ::core::fmt::Debug for BufferRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("BufferRef");
                if let ::core::option::Option::Some(field_storage) = self.storage().transpose() {
                    f.field("storage", &field_storage);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<BufferRef<'a>> for Buffer {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: BufferRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    storage: value.storage()?.map(|v| v.to_vec()),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for BufferRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for BufferRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[BufferRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Buffer>> for Buffer {
            type Value = ::planus::Offset<Buffer>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Buffer>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for BufferRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[BufferRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `BackendDelegateInlineData` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `BackendDelegateInlineData` in the file `schema/program.fbs:231`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct BackendDelegateInlineData {
            /// The field `data` in the table `BackendDelegateInlineData`
            pub data: ::core::option::Option<::planus::alloc::vec::Vec<u8>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for BackendDelegateInlineData {
            fn default() -> Self {
                Self {
                    data: ::core::default::Default::default(),
                }
            }
        }

        impl BackendDelegateInlineData {
            /// Creates a [BackendDelegateInlineDataBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> BackendDelegateInlineDataBuilder<()> {
                BackendDelegateInlineDataBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_data: impl ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_data = field_data.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_data.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u8]>>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_data) = prepared_data {
                            object_writer.write::<_, _, 4>(&prepared_data);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<BackendDelegateInlineData>> for BackendDelegateInlineData {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegateInlineData> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<BackendDelegateInlineData>>
            for BackendDelegateInlineData
        {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BackendDelegateInlineData>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<BackendDelegateInlineData> for BackendDelegateInlineData {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegateInlineData> {
                BackendDelegateInlineData::create(builder, &self.data)
            }
        }

        /// Builder for serializing an instance of the [BackendDelegateInlineData] type.
        ///
        /// Can be created using the [BackendDelegateInlineData::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct BackendDelegateInlineDataBuilder<State>(State);

        impl BackendDelegateInlineDataBuilder<()> {
            /// Setter for the [`data` field](BackendDelegateInlineData#structfield.data).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn data<T0>(self, value: T0) -> BackendDelegateInlineDataBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            {
                BackendDelegateInlineDataBuilder((value,))
            }

            /// Sets the [`data` field](BackendDelegateInlineData#structfield.data) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn data_as_null(self) -> BackendDelegateInlineDataBuilder<((),)> {
                self.data(())
            }
        }

        impl<T0> BackendDelegateInlineDataBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [BackendDelegateInlineData].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegateInlineData>
            where
                Self: ::planus::WriteAsOffset<BackendDelegateInlineData>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[u8]>>>
            ::planus::WriteAs<::planus::Offset<BackendDelegateInlineData>>
            for BackendDelegateInlineDataBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<BackendDelegateInlineData>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegateInlineData> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[u8]>>>
            ::planus::WriteAsOptional<::planus::Offset<BackendDelegateInlineData>>
            for BackendDelegateInlineDataBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<BackendDelegateInlineData>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BackendDelegateInlineData>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptional<::planus::Offset<[u8]>>>
            ::planus::WriteAsOffset<BackendDelegateInlineData>
            for BackendDelegateInlineDataBuilder<(T0,)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BackendDelegateInlineData> {
                let (v0,) = &self.0;
                BackendDelegateInlineData::create(builder, v0)
            }
        }

        /// Reference to a deserialized [BackendDelegateInlineData].
        #[derive(Copy, Clone)]
        pub struct BackendDelegateInlineDataRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> BackendDelegateInlineDataRef<'a> {
            /// Getter for the [`data` field](BackendDelegateInlineData#structfield.data).
            #[inline]
            pub fn data(&self) -> ::planus::Result<::core::option::Option<&'a [u8]>> {
                self.0.access(0, "BackendDelegateInlineData", "data")
            }
        }

        impl<'a> ::core::fmt::Debug for BackendDelegateInlineDataRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("BackendDelegateInlineDataRef");
                if let ::core::option::Option::Some(field_data) = self.data().transpose() {
                    f.field("data", &field_data);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<BackendDelegateInlineDataRef<'a>> for BackendDelegateInlineData {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: BackendDelegateInlineDataRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    data: value.data()?.map(|v| v.to_vec()),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for BackendDelegateInlineDataRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for BackendDelegateInlineDataRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[BackendDelegateInlineDataRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<BackendDelegateInlineData>>
            for BackendDelegateInlineData
        {
            type Value = ::planus::Offset<BackendDelegateInlineData>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<BackendDelegateInlineData>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for BackendDelegateInlineDataRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[BackendDelegateInlineDataRef]",
                        "read_as_root",
                        0,
                    )
                })
            }
        }

        /// The table `DataSegment` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `DataSegment` in the file `schema/program.fbs:237`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct DataSegment {
            /// The field `offset` in the table `DataSegment`
            pub offset: u64,
            /// The field `size` in the table `DataSegment`
            pub size: u64,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for DataSegment {
            fn default() -> Self {
                Self { offset: 0, size: 0 }
            }
        }

        impl DataSegment {
            /// Creates a [DataSegmentBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> DataSegmentBuilder<()> {
                DataSegmentBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_offset: impl ::planus::WriteAsDefault<u64, u64>,
                field_size: impl ::planus::WriteAsDefault<u64, u64>,
            ) -> ::planus::Offset<Self> {
                let prepared_offset = field_offset.prepare(builder, &0);
                let prepared_size = field_size.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_offset.is_some() {
                    table_writer.write_entry::<u64>(0);
                }
                if prepared_size.is_some() {
                    table_writer.write_entry::<u64>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_offset) = prepared_offset {
                            object_writer.write::<_, _, 8>(&prepared_offset);
                        }
                        if let ::core::option::Option::Some(prepared_size) = prepared_size {
                            object_writer.write::<_, _, 8>(&prepared_size);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<DataSegment>> for DataSegment {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DataSegment> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<DataSegment>> for DataSegment {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<DataSegment>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<DataSegment> for DataSegment {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DataSegment> {
                DataSegment::create(builder, self.offset, self.size)
            }
        }

        /// Builder for serializing an instance of the [DataSegment] type.
        ///
        /// Can be created using the [DataSegment::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct DataSegmentBuilder<State>(State);

        impl DataSegmentBuilder<()> {
            /// Setter for the [`offset` field](DataSegment#structfield.offset).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn offset<T0>(self, value: T0) -> DataSegmentBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u64, u64>,
            {
                DataSegmentBuilder((value,))
            }

            /// Sets the [`offset` field](DataSegment#structfield.offset) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn offset_as_default(self) -> DataSegmentBuilder<(::planus::DefaultValue,)> {
                self.offset(::planus::DefaultValue)
            }
        }

        impl<T0> DataSegmentBuilder<(T0,)> {
            /// Setter for the [`size` field](DataSegment#structfield.size).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn size<T1>(self, value: T1) -> DataSegmentBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u64, u64>,
            {
                let (v0,) = self.0;
                DataSegmentBuilder((v0, value))
            }

            /// Sets the [`size` field](DataSegment#structfield.size) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn size_as_default(self) -> DataSegmentBuilder<(T0, ::planus::DefaultValue)> {
                self.size(::planus::DefaultValue)
            }
        }

        impl<T0, T1> DataSegmentBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [DataSegment].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<DataSegment>
            where
                Self: ::planus::WriteAsOffset<DataSegment>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<u64, u64>, T1: ::planus::WriteAsDefault<u64, u64>>
            ::planus::WriteAs<::planus::Offset<DataSegment>> for DataSegmentBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<DataSegment>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DataSegment> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<u64, u64>, T1: ::planus::WriteAsDefault<u64, u64>>
            ::planus::WriteAsOptional<::planus::Offset<DataSegment>>
            for DataSegmentBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<DataSegment>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<DataSegment>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<u64, u64>, T1: ::planus::WriteAsDefault<u64, u64>>
            ::planus::WriteAsOffset<DataSegment> for DataSegmentBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DataSegment> {
                let (v0, v1) = &self.0;
                DataSegment::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [DataSegment].
        #[derive(Copy, Clone)]
        pub struct DataSegmentRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> DataSegmentRef<'a> {
            /// Getter for the [`offset` field](DataSegment#structfield.offset).
            #[inline]
            pub fn offset(&self) -> ::planus::Result<u64> {
                ::core::result::Result::Ok(self.0.access(0, "DataSegment", "offset")?.unwrap_or(0))
            }

            /// Getter for the [`size` field](DataSegment#structfield.size).
            #[inline]
            pub fn size(&self) -> ::planus::Result<u64> {
                ::core::result::Result::Ok(self.0.access(1, "DataSegment", "size")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for DataSegmentRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("DataSegmentRef");
                f.field("offset", &self.offset());
                f.field("size", &self.size());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<DataSegmentRef<'a>> for DataSegment {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: DataSegmentRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    offset: ::core::convert::TryInto::try_into(value.offset()?)?,
                    size: ::core::convert::TryInto::try_into(value.size()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for DataSegmentRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for DataSegmentRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[DataSegmentRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<DataSegment>> for DataSegment {
            type Value = ::planus::Offset<DataSegment>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<DataSegment>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for DataSegmentRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[DataSegmentRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `SubsegmentOffsets` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `SubsegmentOffsets` in the file `schema/program.fbs:242`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct SubsegmentOffsets {
            /// The field `segment_index` in the table `SubsegmentOffsets`
            pub segment_index: u32,
            /// The field `offsets` in the table `SubsegmentOffsets`
            pub offsets: ::core::option::Option<::planus::alloc::vec::Vec<u64>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for SubsegmentOffsets {
            fn default() -> Self {
                Self {
                    segment_index: 0,
                    offsets: ::core::default::Default::default(),
                }
            }
        }

        impl SubsegmentOffsets {
            /// Creates a [SubsegmentOffsetsBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> SubsegmentOffsetsBuilder<()> {
                SubsegmentOffsetsBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_segment_index: impl ::planus::WriteAsDefault<u32, u32>,
                field_offsets: impl ::planus::WriteAsOptional<::planus::Offset<[u64]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_segment_index = field_segment_index.prepare(builder, &0);
                let prepared_offsets = field_offsets.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_segment_index.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_offsets.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u64]>>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_segment_index) =
                            prepared_segment_index
                        {
                            object_writer.write::<_, _, 4>(&prepared_segment_index);
                        }
                        if let ::core::option::Option::Some(prepared_offsets) = prepared_offsets {
                            object_writer.write::<_, _, 4>(&prepared_offsets);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<SubsegmentOffsets>> for SubsegmentOffsets {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<SubsegmentOffsets> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<SubsegmentOffsets>> for SubsegmentOffsets {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<SubsegmentOffsets>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<SubsegmentOffsets> for SubsegmentOffsets {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<SubsegmentOffsets> {
                SubsegmentOffsets::create(builder, self.segment_index, &self.offsets)
            }
        }

        /// Builder for serializing an instance of the [SubsegmentOffsets] type.
        ///
        /// Can be created using the [SubsegmentOffsets::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct SubsegmentOffsetsBuilder<State>(State);

        impl SubsegmentOffsetsBuilder<()> {
            /// Setter for the [`segment_index` field](SubsegmentOffsets#structfield.segment_index).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn segment_index<T0>(self, value: T0) -> SubsegmentOffsetsBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                SubsegmentOffsetsBuilder((value,))
            }

            /// Sets the [`segment_index` field](SubsegmentOffsets#structfield.segment_index) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn segment_index_as_default(
                self,
            ) -> SubsegmentOffsetsBuilder<(::planus::DefaultValue,)> {
                self.segment_index(::planus::DefaultValue)
            }
        }

        impl<T0> SubsegmentOffsetsBuilder<(T0,)> {
            /// Setter for the [`offsets` field](SubsegmentOffsets#structfield.offsets).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn offsets<T1>(self, value: T1) -> SubsegmentOffsetsBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[u64]>>,
            {
                let (v0,) = self.0;
                SubsegmentOffsetsBuilder((v0, value))
            }

            /// Sets the [`offsets` field](SubsegmentOffsets#structfield.offsets) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn offsets_as_null(self) -> SubsegmentOffsetsBuilder<(T0, ())> {
                self.offsets(())
            }
        }

        impl<T0, T1> SubsegmentOffsetsBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [SubsegmentOffsets].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<SubsegmentOffsets>
            where
                Self: ::planus::WriteAsOffset<SubsegmentOffsets>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u64]>>,
            > ::planus::WriteAs<::planus::Offset<SubsegmentOffsets>>
            for SubsegmentOffsetsBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<SubsegmentOffsets>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<SubsegmentOffsets> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u64]>>,
            > ::planus::WriteAsOptional<::planus::Offset<SubsegmentOffsets>>
            for SubsegmentOffsetsBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<SubsegmentOffsets>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<SubsegmentOffsets>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u64]>>,
            > ::planus::WriteAsOffset<SubsegmentOffsets> for SubsegmentOffsetsBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<SubsegmentOffsets> {
                let (v0, v1) = &self.0;
                SubsegmentOffsets::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [SubsegmentOffsets].
        #[derive(Copy, Clone)]
        pub struct SubsegmentOffsetsRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> SubsegmentOffsetsRef<'a> {
            /// Getter for the [`segment_index` field](SubsegmentOffsets#structfield.segment_index).
            #[inline]
            pub fn segment_index(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "SubsegmentOffsets", "segment_index")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`offsets` field](SubsegmentOffsets#structfield.offsets).
            #[inline]
            pub fn offsets(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u64>>> {
                self.0.access(1, "SubsegmentOffsets", "offsets")
            }
        }

        impl<'a> ::core::fmt::Debug for SubsegmentOffsetsRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("SubsegmentOffsetsRef");
                f.field("segment_index", &self.segment_index());
                if let ::core::option::Option::Some(field_offsets) = self.offsets().transpose() {
                    f.field("offsets", &field_offsets);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<SubsegmentOffsetsRef<'a>> for SubsegmentOffsets {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: SubsegmentOffsetsRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    segment_index: ::core::convert::TryInto::try_into(value.segment_index()?)?,
                    offsets: if let ::core::option::Option::Some(offsets) = value.offsets()? {
                        ::core::option::Option::Some(offsets.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for SubsegmentOffsetsRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for SubsegmentOffsetsRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[SubsegmentOffsetsRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<SubsegmentOffsets>> for SubsegmentOffsets {
            type Value = ::planus::Offset<SubsegmentOffsets>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<SubsegmentOffsets>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for SubsegmentOffsetsRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[SubsegmentOffsetsRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `NamedData` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `NamedData` in the file `schema/program.fbs:247`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct NamedData {
            /// The field `key` in the table `NamedData`
            pub key: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `segment_index` in the table `NamedData`
            pub segment_index: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for NamedData {
            fn default() -> Self {
                Self {
                    key: ::core::default::Default::default(),
                    segment_index: 0,
                }
            }
        }

        impl NamedData {
            /// Creates a [NamedDataBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> NamedDataBuilder<()> {
                NamedDataBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_key: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                field_segment_index: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_key = field_key.prepare(builder);
                let prepared_segment_index = field_segment_index.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_key.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }
                if prepared_segment_index.is_some() {
                    table_writer.write_entry::<u32>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_key) = prepared_key {
                            object_writer.write::<_, _, 4>(&prepared_key);
                        }
                        if let ::core::option::Option::Some(prepared_segment_index) =
                            prepared_segment_index
                        {
                            object_writer.write::<_, _, 4>(&prepared_segment_index);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<NamedData>> for NamedData {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<NamedData> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<NamedData>> for NamedData {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<NamedData>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<NamedData> for NamedData {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<NamedData> {
                NamedData::create(builder, &self.key, self.segment_index)
            }
        }

        /// Builder for serializing an instance of the [NamedData] type.
        ///
        /// Can be created using the [NamedData::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct NamedDataBuilder<State>(State);

        impl NamedDataBuilder<()> {
            /// Setter for the [`key` field](NamedData#structfield.key).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn key<T0>(self, value: T0) -> NamedDataBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                NamedDataBuilder((value,))
            }

            /// Sets the [`key` field](NamedData#structfield.key) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn key_as_null(self) -> NamedDataBuilder<((),)> {
                self.key(())
            }
        }

        impl<T0> NamedDataBuilder<(T0,)> {
            /// Setter for the [`segment_index` field](NamedData#structfield.segment_index).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn segment_index<T1>(self, value: T1) -> NamedDataBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                NamedDataBuilder((v0, value))
            }

            /// Sets the [`segment_index` field](NamedData#structfield.segment_index) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn segment_index_as_default(
                self,
            ) -> NamedDataBuilder<(T0, ::planus::DefaultValue)> {
                self.segment_index(::planus::DefaultValue)
            }
        }

        impl<T0, T1> NamedDataBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [NamedData].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<NamedData>
            where
                Self: ::planus::WriteAsOffset<NamedData>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<NamedData>> for NamedDataBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<NamedData>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<NamedData> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<NamedData>>
            for NamedDataBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<NamedData>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<NamedData>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<NamedData> for NamedDataBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<NamedData> {
                let (v0, v1) = &self.0;
                NamedData::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [NamedData].
        #[derive(Copy, Clone)]
        pub struct NamedDataRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> NamedDataRef<'a> {
            /// Getter for the [`key` field](NamedData#structfield.key).
            #[inline]
            pub fn key(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "NamedData", "key")
            }

            /// Getter for the [`segment_index` field](NamedData#structfield.segment_index).
            #[inline]
            pub fn segment_index(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(1, "NamedData", "segment_index")?.unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for NamedDataRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("NamedDataRef");
                if let ::core::option::Option::Some(field_key) = self.key().transpose() {
                    f.field("key", &field_key);
                }
                f.field("segment_index", &self.segment_index());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<NamedDataRef<'a>> for NamedData {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: NamedDataRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    key: value.key()?.map(::core::convert::Into::into),
                    segment_index: ::core::convert::TryInto::try_into(value.segment_index()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for NamedDataRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for NamedDataRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[NamedDataRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<NamedData>> for NamedData {
            type Value = ::planus::Offset<NamedData>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<NamedData>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for NamedDataRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[NamedDataRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Program` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Program` in the file `schema/program.fbs:252`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct Program {
            /// The field `version` in the table `Program`
            pub version: u32,
            /// The field `execution_plan` in the table `Program`
            pub execution_plan:
                ::core::option::Option<::planus::alloc::vec::Vec<self::ExecutionPlan>>,
            /// The field `constant_buffer` in the table `Program`
            pub constant_buffer: ::core::option::Option<::planus::alloc::vec::Vec<self::Buffer>>,
            /// The field `backend_delegate_data` in the table `Program`
            pub backend_delegate_data:
                ::core::option::Option<::planus::alloc::vec::Vec<self::BackendDelegateInlineData>>,
            /// The field `segments` in the table `Program`
            pub segments: ::core::option::Option<::planus::alloc::vec::Vec<self::DataSegment>>,
            /// The field `constant_segment` in the table `Program`
            pub constant_segment:
                ::core::option::Option<::planus::alloc::boxed::Box<self::SubsegmentOffsets>>,
            /// The field `mutable_data_segments` in the table `Program`
            pub mutable_data_segments:
                ::core::option::Option<::planus::alloc::vec::Vec<self::SubsegmentOffsets>>,
            /// The field `named_data` in the table `Program`
            pub named_data: ::core::option::Option<::planus::alloc::vec::Vec<self::NamedData>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Program {
            fn default() -> Self {
                Self {
                    version: 0,
                    execution_plan: ::core::default::Default::default(),
                    constant_buffer: ::core::default::Default::default(),
                    backend_delegate_data: ::core::default::Default::default(),
                    segments: ::core::default::Default::default(),
                    constant_segment: ::core::default::Default::default(),
                    mutable_data_segments: ::core::default::Default::default(),
                    named_data: ::core::default::Default::default(),
                }
            }
        }

        impl Program {
            /// Creates a [ProgramBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> ProgramBuilder<()> {
                ProgramBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_version: impl ::planus::WriteAsDefault<u32, u32>,
                field_execution_plan: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::ExecutionPlan>]>,
                >,
                field_constant_buffer: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::Buffer>]>,
                >,
                field_backend_delegate_data: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BackendDelegateInlineData>]>,
                >,
                field_segments: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::DataSegment>]>,
                >,
                field_constant_segment: impl ::planus::WriteAsOptional<
                    ::planus::Offset<self::SubsegmentOffsets>,
                >,
                field_mutable_data_segments: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::SubsegmentOffsets>]>,
                >,
                field_named_data: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::NamedData>]>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_version = field_version.prepare(builder, &0);
                let prepared_execution_plan = field_execution_plan.prepare(builder);
                let prepared_constant_buffer = field_constant_buffer.prepare(builder);
                let prepared_backend_delegate_data = field_backend_delegate_data.prepare(builder);
                let prepared_segments = field_segments.prepare(builder);
                let prepared_constant_segment = field_constant_segment.prepare(builder);
                let prepared_mutable_data_segments = field_mutable_data_segments.prepare(builder);
                let prepared_named_data = field_named_data.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<20> =
                    ::core::default::Default::default();
                if prepared_version.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_execution_plan.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::ExecutionPlan>]>>(
                            1,
                        );
                }
                if prepared_constant_buffer.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::Buffer>]>>(2);
                }
                if prepared_backend_delegate_data.is_some() {
                    table_writer.write_entry::<::planus::Offset<
                        [::planus::Offset<self::BackendDelegateInlineData>],
                    >>(3);
                }
                if prepared_segments.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::DataSegment>]>>(4);
                }
                if prepared_constant_segment.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::SubsegmentOffsets>>(5);
                }
                if prepared_mutable_data_segments.is_some() {
                    table_writer.write_entry::<::planus::Offset<[::planus::Offset<self::SubsegmentOffsets>]>>(6);
                }
                if prepared_named_data.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::NamedData>]>>(7);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_version) = prepared_version {
                            object_writer.write::<_, _, 4>(&prepared_version);
                        }
                        if let ::core::option::Option::Some(prepared_execution_plan) =
                            prepared_execution_plan
                        {
                            object_writer.write::<_, _, 4>(&prepared_execution_plan);
                        }
                        if let ::core::option::Option::Some(prepared_constant_buffer) =
                            prepared_constant_buffer
                        {
                            object_writer.write::<_, _, 4>(&prepared_constant_buffer);
                        }
                        if let ::core::option::Option::Some(prepared_backend_delegate_data) =
                            prepared_backend_delegate_data
                        {
                            object_writer.write::<_, _, 4>(&prepared_backend_delegate_data);
                        }
                        if let ::core::option::Option::Some(prepared_segments) = prepared_segments {
                            object_writer.write::<_, _, 4>(&prepared_segments);
                        }
                        if let ::core::option::Option::Some(prepared_constant_segment) =
                            prepared_constant_segment
                        {
                            object_writer.write::<_, _, 4>(&prepared_constant_segment);
                        }
                        if let ::core::option::Option::Some(prepared_mutable_data_segments) =
                            prepared_mutable_data_segments
                        {
                            object_writer.write::<_, _, 4>(&prepared_mutable_data_segments);
                        }
                        if let ::core::option::Option::Some(prepared_named_data) =
                            prepared_named_data
                        {
                            object_writer.write::<_, _, 4>(&prepared_named_data);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Program>> for Program {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Program> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Program>> for Program {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Program>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Program> for Program {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Program> {
                Program::create(
                    builder,
                    self.version,
                    &self.execution_plan,
                    &self.constant_buffer,
                    &self.backend_delegate_data,
                    &self.segments,
                    &self.constant_segment,
                    &self.mutable_data_segments,
                    &self.named_data,
                )
            }
        }

        /// Builder for serializing an instance of the [Program] type.
        ///
        /// Can be created using the [Program::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct ProgramBuilder<State>(State);

        impl ProgramBuilder<()> {
            /// Setter for the [`version` field](Program#structfield.version).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn version<T0>(self, value: T0) -> ProgramBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                ProgramBuilder((value,))
            }

            /// Sets the [`version` field](Program#structfield.version) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn version_as_default(self) -> ProgramBuilder<(::planus::DefaultValue,)> {
                self.version(::planus::DefaultValue)
            }
        }

        impl<T0> ProgramBuilder<(T0,)> {
            /// Setter for the [`execution_plan` field](Program#structfield.execution_plan).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn execution_plan<T1>(self, value: T1) -> ProgramBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::ExecutionPlan>]>,
                >,
            {
                let (v0,) = self.0;
                ProgramBuilder((v0, value))
            }

            /// Sets the [`execution_plan` field](Program#structfield.execution_plan) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn execution_plan_as_null(self) -> ProgramBuilder<(T0, ())> {
                self.execution_plan(())
            }
        }

        impl<T0, T1> ProgramBuilder<(T0, T1)> {
            /// Setter for the [`constant_buffer` field](Program#structfield.constant_buffer).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn constant_buffer<T2>(self, value: T2) -> ProgramBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Buffer>]>>,
            {
                let (v0, v1) = self.0;
                ProgramBuilder((v0, v1, value))
            }

            /// Sets the [`constant_buffer` field](Program#structfield.constant_buffer) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn constant_buffer_as_null(self) -> ProgramBuilder<(T0, T1, ())> {
                self.constant_buffer(())
            }
        }

        impl<T0, T1, T2> ProgramBuilder<(T0, T1, T2)> {
            /// Setter for the [`backend_delegate_data` field](Program#structfield.backend_delegate_data).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn backend_delegate_data<T3>(self, value: T3) -> ProgramBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BackendDelegateInlineData>]>,
                >,
            {
                let (v0, v1, v2) = self.0;
                ProgramBuilder((v0, v1, v2, value))
            }

            /// Sets the [`backend_delegate_data` field](Program#structfield.backend_delegate_data) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn backend_delegate_data_as_null(self) -> ProgramBuilder<(T0, T1, T2, ())> {
                self.backend_delegate_data(())
            }
        }

        impl<T0, T1, T2, T3> ProgramBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`segments` field](Program#structfield.segments).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn segments<T4>(self, value: T4) -> ProgramBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::DataSegment>]>,
                >,
            {
                let (v0, v1, v2, v3) = self.0;
                ProgramBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`segments` field](Program#structfield.segments) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn segments_as_null(self) -> ProgramBuilder<(T0, T1, T2, T3, ())> {
                self.segments(())
            }
        }

        impl<T0, T1, T2, T3, T4> ProgramBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`constant_segment` field](Program#structfield.constant_segment).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn constant_segment<T5>(self, value: T5) -> ProgramBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsOptional<::planus::Offset<self::SubsegmentOffsets>>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                ProgramBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`constant_segment` field](Program#structfield.constant_segment) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn constant_segment_as_null(self) -> ProgramBuilder<(T0, T1, T2, T3, T4, ())> {
                self.constant_segment(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5> ProgramBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Setter for the [`mutable_data_segments` field](Program#structfield.mutable_data_segments).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn mutable_data_segments<T6>(
                self,
                value: T6,
            ) -> ProgramBuilder<(T0, T1, T2, T3, T4, T5, T6)>
            where
                T6: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::SubsegmentOffsets>]>,
                >,
            {
                let (v0, v1, v2, v3, v4, v5) = self.0;
                ProgramBuilder((v0, v1, v2, v3, v4, v5, value))
            }

            /// Sets the [`mutable_data_segments` field](Program#structfield.mutable_data_segments) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn mutable_data_segments_as_null(
                self,
            ) -> ProgramBuilder<(T0, T1, T2, T3, T4, T5, ())> {
                self.mutable_data_segments(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6> ProgramBuilder<(T0, T1, T2, T3, T4, T5, T6)> {
            /// Setter for the [`named_data` field](Program#structfield.named_data).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn named_data<T7>(
                self,
                value: T7,
            ) -> ProgramBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
            where
                T7: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::NamedData>]>,
                >,
            {
                let (v0, v1, v2, v3, v4, v5, v6) = self.0;
                ProgramBuilder((v0, v1, v2, v3, v4, v5, v6, value))
            }

            /// Sets the [`named_data` field](Program#structfield.named_data) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn named_data_as_null(self) -> ProgramBuilder<(T0, T1, T2, T3, T4, T5, T6, ())> {
                self.named_data(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7> ProgramBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Program].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Program>
            where
                Self: ::planus::WriteAsOffset<Program>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::ExecutionPlan>]>,
                >,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Buffer>]>>,
                T3: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BackendDelegateInlineData>]>,
                >,
                T4: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::DataSegment>]>>,
                T5: ::planus::WriteAsOptional<::planus::Offset<self::SubsegmentOffsets>>,
                T6: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::SubsegmentOffsets>]>,
                >,
                T7: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::NamedData>]>>,
            > ::planus::WriteAs<::planus::Offset<Program>>
            for ProgramBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
        {
            type Prepared = ::planus::Offset<Program>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Program> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::ExecutionPlan>]>,
                >,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Buffer>]>>,
                T3: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BackendDelegateInlineData>]>,
                >,
                T4: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::DataSegment>]>>,
                T5: ::planus::WriteAsOptional<::planus::Offset<self::SubsegmentOffsets>>,
                T6: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::SubsegmentOffsets>]>,
                >,
                T7: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::NamedData>]>>,
            > ::planus::WriteAsOptional<::planus::Offset<Program>>
            for ProgramBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
        {
            type Prepared = ::planus::Offset<Program>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Program>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::ExecutionPlan>]>,
                >,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Buffer>]>>,
                T3: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BackendDelegateInlineData>]>,
                >,
                T4: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::DataSegment>]>>,
                T5: ::planus::WriteAsOptional<::planus::Offset<self::SubsegmentOffsets>>,
                T6: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::SubsegmentOffsets>]>,
                >,
                T7: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::NamedData>]>>,
            > ::planus::WriteAsOffset<Program>
            for ProgramBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Program> {
                let (v0, v1, v2, v3, v4, v5, v6, v7) = &self.0;
                Program::create(builder, v0, v1, v2, v3, v4, v5, v6, v7)
            }
        }

        /// Reference to a deserialized [Program].
        #[derive(Copy, Clone)]
        pub struct ProgramRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> ProgramRef<'a> {
            /// Getter for the [`version` field](Program#structfield.version).
            #[inline]
            pub fn version(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(0, "Program", "version")?.unwrap_or(0))
            }

            /// Getter for the [`execution_plan` field](Program#structfield.execution_plan).
            #[inline]
            pub fn execution_plan(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::ExecutionPlanRef<'a>>>,
                >,
            > {
                self.0.access(1, "Program", "execution_plan")
            }

            /// Getter for the [`constant_buffer` field](Program#structfield.constant_buffer).
            #[inline]
            pub fn constant_buffer(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<::planus::Vector<'a, ::planus::Result<self::BufferRef<'a>>>>,
            > {
                self.0.access(2, "Program", "constant_buffer")
            }

            /// Getter for the [`backend_delegate_data` field](Program#structfield.backend_delegate_data).
            #[inline]
            pub fn backend_delegate_data(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::BackendDelegateInlineDataRef<'a>>>,
                >,
            > {
                self.0.access(3, "Program", "backend_delegate_data")
            }

            /// Getter for the [`segments` field](Program#structfield.segments).
            #[inline]
            pub fn segments(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::DataSegmentRef<'a>>>,
                >,
            > {
                self.0.access(4, "Program", "segments")
            }

            /// Getter for the [`constant_segment` field](Program#structfield.constant_segment).
            #[inline]
            pub fn constant_segment(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::SubsegmentOffsetsRef<'a>>>
            {
                self.0.access(5, "Program", "constant_segment")
            }

            /// Getter for the [`mutable_data_segments` field](Program#structfield.mutable_data_segments).
            #[inline]
            pub fn mutable_data_segments(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::SubsegmentOffsetsRef<'a>>>,
                >,
            > {
                self.0.access(6, "Program", "mutable_data_segments")
            }

            /// Getter for the [`named_data` field](Program#structfield.named_data).
            #[inline]
            pub fn named_data(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::NamedDataRef<'a>>>,
                >,
            > {
                self.0.access(7, "Program", "named_data")
            }
        }

        impl<'a> ::core::fmt::Debug for ProgramRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("ProgramRef");
                f.field("version", &self.version());
                if let ::core::option::Option::Some(field_execution_plan) =
                    self.execution_plan().transpose()
                {
                    f.field("execution_plan", &field_execution_plan);
                }
                if let ::core::option::Option::Some(field_constant_buffer) =
                    self.constant_buffer().transpose()
                {
                    f.field("constant_buffer", &field_constant_buffer);
                }
                if let ::core::option::Option::Some(field_backend_delegate_data) =
                    self.backend_delegate_data().transpose()
                {
                    f.field("backend_delegate_data", &field_backend_delegate_data);
                }
                if let ::core::option::Option::Some(field_segments) = self.segments().transpose() {
                    f.field("segments", &field_segments);
                }
                if let ::core::option::Option::Some(field_constant_segment) =
                    self.constant_segment().transpose()
                {
                    f.field("constant_segment", &field_constant_segment);
                }
                if let ::core::option::Option::Some(field_mutable_data_segments) =
                    self.mutable_data_segments().transpose()
                {
                    f.field("mutable_data_segments", &field_mutable_data_segments);
                }
                if let ::core::option::Option::Some(field_named_data) =
                    self.named_data().transpose()
                {
                    f.field("named_data", &field_named_data);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<ProgramRef<'a>> for Program {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: ProgramRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    version: ::core::convert::TryInto::try_into(value.version()?)?,
                    execution_plan: if let ::core::option::Option::Some(execution_plan) =
                        value.execution_plan()?
                    {
                        ::core::option::Option::Some(execution_plan.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    constant_buffer: if let ::core::option::Option::Some(constant_buffer) =
                        value.constant_buffer()?
                    {
                        ::core::option::Option::Some(constant_buffer.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    backend_delegate_data: if let ::core::option::Option::Some(
                        backend_delegate_data,
                    ) = value.backend_delegate_data()?
                    {
                        ::core::option::Option::Some(backend_delegate_data.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    segments: if let ::core::option::Option::Some(segments) = value.segments()? {
                        ::core::option::Option::Some(segments.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    constant_segment: if let ::core::option::Option::Some(constant_segment) =
                        value.constant_segment()?
                    {
                        ::core::option::Option::Some(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryInto::try_into(constant_segment)?,
                        ))
                    } else {
                        ::core::option::Option::None
                    },
                    mutable_data_segments: if let ::core::option::Option::Some(
                        mutable_data_segments,
                    ) = value.mutable_data_segments()?
                    {
                        ::core::option::Option::Some(mutable_data_segments.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    named_data: if let ::core::option::Option::Some(named_data) =
                        value.named_data()?
                    {
                        ::core::option::Option::Some(named_data.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for ProgramRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for ProgramRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[ProgramRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Program>> for Program {
            type Value = ::planus::Offset<Program>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Program>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for ProgramRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[ProgramRef]", "read_as_root", 0)
                })
            }
        }

        /// The enum `ScalarType` in the namespace `executorch_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Enum `ScalarType` in the file `schema/scalar_type.fbs:11`
        #[derive(
            Copy,
            Clone,
            Debug,
            PartialEq,
            Eq,
            PartialOrd,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        #[repr(i8)]
        pub enum ScalarType {
            /// The variant `BYTE` in the enum `ScalarType`
            Byte = 0,

            /// The variant `CHAR` in the enum `ScalarType`
            Char = 1,

            /// The variant `SHORT` in the enum `ScalarType`
            Short = 2,

            /// The variant `INT` in the enum `ScalarType`
            Int = 3,

            /// The variant `LONG` in the enum `ScalarType`
            Long = 4,

            /// The variant `HALF` in the enum `ScalarType`
            Half = 5,

            /// The variant `FLOAT` in the enum `ScalarType`
            Float = 6,

            /// The variant `DOUBLE` in the enum `ScalarType`
            Double = 7,

            /// The variant `COMPLEX32` in the enum `ScalarType`
            Complex32 = 8,

            /// The variant `COMPLEX64` in the enum `ScalarType`
            Complex64 = 9,

            /// The variant `COMPLEX128` in the enum `ScalarType`
            Complex128 = 10,

            /// The variant `BOOL` in the enum `ScalarType`
            Bool = 11,

            /// The variant `QINT8` in the enum `ScalarType`
            Qint8 = 12,

            /// The variant `QUINT8` in the enum `ScalarType`
            Quint8 = 13,

            /// The variant `QINT32` in the enum `ScalarType`
            Qint32 = 14,

            /// The variant `BFLOAT16` in the enum `ScalarType`
            Bfloat16 = 15,

            /// The variant `QUINT4X2` in the enum `ScalarType`
            Quint4x2 = 16,

            /// The variant `QUINT2X4` in the enum `ScalarType`
            Quint2x4 = 17,

            /// The variant `BITS1X8` in the enum `ScalarType`
            Bits1x8 = 18,

            /// The variant `BITS2X4` in the enum `ScalarType`
            Bits2x4 = 19,

            /// The variant `BITS4X2` in the enum `ScalarType`
            Bits4x2 = 20,

            /// The variant `BITS8` in the enum `ScalarType`
            Bits8 = 21,

            /// The variant `BITS16` in the enum `ScalarType`
            Bits16 = 22,

            /// The variant `FLOAT8E5M2` in the enum `ScalarType`
            Float8e5m2 = 23,

            /// The variant `FLOAT8E4M3FN` in the enum `ScalarType`
            Float8e4m3fn = 24,

            /// The variant `FLOAT8E5M2FNUZ` in the enum `ScalarType`
            Float8e5m2fnuz = 25,

            /// The variant `FLOAT8E4M3FNUZ` in the enum `ScalarType`
            Float8e4m3fnuz = 26,

            /// The variant `UINT16` in the enum `ScalarType`
            Uint16 = 27,

            /// The variant `UINT32` in the enum `ScalarType`
            Uint32 = 28,

            /// The variant `UINT64` in the enum `ScalarType`
            Uint64 = 29,
        }

        impl ScalarType {
            /// Array containing all valid variants of ScalarType
            pub const ENUM_VALUES: [Self; 30] = [
                Self::Byte,
                Self::Char,
                Self::Short,
                Self::Int,
                Self::Long,
                Self::Half,
                Self::Float,
                Self::Double,
                Self::Complex32,
                Self::Complex64,
                Self::Complex128,
                Self::Bool,
                Self::Qint8,
                Self::Quint8,
                Self::Qint32,
                Self::Bfloat16,
                Self::Quint4x2,
                Self::Quint2x4,
                Self::Bits1x8,
                Self::Bits2x4,
                Self::Bits4x2,
                Self::Bits8,
                Self::Bits16,
                Self::Float8e5m2,
                Self::Float8e4m3fn,
                Self::Float8e5m2fnuz,
                Self::Float8e4m3fnuz,
                Self::Uint16,
                Self::Uint32,
                Self::Uint64,
            ];
        }

        impl ::core::convert::TryFrom<i8> for ScalarType {
            type Error = ::planus::errors::UnknownEnumTagKind;
            #[inline]
            fn try_from(
                value: i8,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTagKind> {
                #[allow(clippy::match_single_binding)]
                match value {
                    0 => ::core::result::Result::Ok(ScalarType::Byte),
                    1 => ::core::result::Result::Ok(ScalarType::Char),
                    2 => ::core::result::Result::Ok(ScalarType::Short),
                    3 => ::core::result::Result::Ok(ScalarType::Int),
                    4 => ::core::result::Result::Ok(ScalarType::Long),
                    5 => ::core::result::Result::Ok(ScalarType::Half),
                    6 => ::core::result::Result::Ok(ScalarType::Float),
                    7 => ::core::result::Result::Ok(ScalarType::Double),
                    8 => ::core::result::Result::Ok(ScalarType::Complex32),
                    9 => ::core::result::Result::Ok(ScalarType::Complex64),
                    10 => ::core::result::Result::Ok(ScalarType::Complex128),
                    11 => ::core::result::Result::Ok(ScalarType::Bool),
                    12 => ::core::result::Result::Ok(ScalarType::Qint8),
                    13 => ::core::result::Result::Ok(ScalarType::Quint8),
                    14 => ::core::result::Result::Ok(ScalarType::Qint32),
                    15 => ::core::result::Result::Ok(ScalarType::Bfloat16),
                    16 => ::core::result::Result::Ok(ScalarType::Quint4x2),
                    17 => ::core::result::Result::Ok(ScalarType::Quint2x4),
                    18 => ::core::result::Result::Ok(ScalarType::Bits1x8),
                    19 => ::core::result::Result::Ok(ScalarType::Bits2x4),
                    20 => ::core::result::Result::Ok(ScalarType::Bits4x2),
                    21 => ::core::result::Result::Ok(ScalarType::Bits8),
                    22 => ::core::result::Result::Ok(ScalarType::Bits16),
                    23 => ::core::result::Result::Ok(ScalarType::Float8e5m2),
                    24 => ::core::result::Result::Ok(ScalarType::Float8e4m3fn),
                    25 => ::core::result::Result::Ok(ScalarType::Float8e5m2fnuz),
                    26 => ::core::result::Result::Ok(ScalarType::Float8e4m3fnuz),
                    27 => ::core::result::Result::Ok(ScalarType::Uint16),
                    28 => ::core::result::Result::Ok(ScalarType::Uint32),
                    29 => ::core::result::Result::Ok(ScalarType::Uint64),

                    _ => ::core::result::Result::Err(::planus::errors::UnknownEnumTagKind {
                        tag: value as i128,
                    }),
                }
            }
        }

        impl ::core::convert::From<ScalarType> for i8 {
            #[inline]
            fn from(value: ScalarType) -> Self {
                value as i8
            }
        }

        /// # Safety
        /// The Planus compiler correctly calculates `ALIGNMENT` and `SIZE`.
        unsafe impl ::planus::Primitive for ScalarType {
            const ALIGNMENT: usize = 1;
            const SIZE: usize = 1;
        }

        impl ::planus::WriteAsPrimitive<ScalarType> for ScalarType {
            #[inline]
            fn write<const N: usize>(&self, cursor: ::planus::Cursor<'_, N>, buffer_position: u32) {
                (*self as i8).write(cursor, buffer_position);
            }
        }

        impl ::planus::WriteAs<ScalarType> for ScalarType {
            type Prepared = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> ScalarType {
                *self
            }
        }

        impl ::planus::WriteAsDefault<ScalarType, ScalarType> for ScalarType {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
                default: &ScalarType,
            ) -> ::core::option::Option<ScalarType> {
                if self == default {
                    ::core::option::Option::None
                } else {
                    ::core::option::Option::Some(*self)
                }
            }
        }

        impl ::planus::WriteAsOptional<ScalarType> for ScalarType {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<ScalarType> {
                ::core::option::Option::Some(*self)
            }
        }

        impl<'buf> ::planus::TableRead<'buf> for ScalarType {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                let n: i8 = ::planus::TableRead::from_buffer(buffer, offset)?;
                ::core::result::Result::Ok(::core::convert::TryInto::try_into(n)?)
            }
        }

        impl<'buf> ::planus::VectorReadInner<'buf> for ScalarType {
            type Error = ::planus::errors::UnknownEnumTag;
            const STRIDE: usize = 1;
            #[inline]
            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTag> {
                let value = unsafe { *buffer.buffer.get_unchecked(offset) as i8 };
                let value: ::core::result::Result<Self, _> =
                    ::core::convert::TryInto::try_into(value);
                value.map_err(|error_kind| {
                    error_kind.with_error_location(
                        "ScalarType",
                        "VectorRead::from_buffer",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<ScalarType> for ScalarType {
            const STRIDE: usize = 1;

            type Value = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> Self {
                *self
            }

            #[inline]
            unsafe fn write_values(
                values: &[Self],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 1];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - i as u32,
                    );
                }
            }
        }
    }
    /// The namespace `flat_tensor_flatbuffer`
    ///
    /// Generated from these locations:
    /// * File `schema/flat_tensor.fbs`
    pub mod flat_tensor_flatbuffer {
        /// The table `TensorLayout` in the namespace `flat_tensor_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `TensorLayout` in the file `schema/flat_tensor.fbs:9`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct TensorLayout {
            /// The field `scalar_type` in the table `TensorLayout`
            pub scalar_type: super::executorch_flatbuffer::ScalarType,
            /// The field `sizes` in the table `TensorLayout`
            pub sizes: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
            /// The field `dim_order` in the table `TensorLayout`
            pub dim_order: ::core::option::Option<::planus::alloc::vec::Vec<u8>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for TensorLayout {
            fn default() -> Self {
                Self {
                    scalar_type: super::executorch_flatbuffer::ScalarType::Byte,
                    sizes: ::core::default::Default::default(),
                    dim_order: ::core::default::Default::default(),
                }
            }
        }

        impl TensorLayout {
            /// Creates a [TensorLayoutBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> TensorLayoutBuilder<()> {
                TensorLayoutBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_scalar_type: impl ::planus::WriteAsDefault<
                    super::executorch_flatbuffer::ScalarType,
                    super::executorch_flatbuffer::ScalarType,
                >,
                field_sizes: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                field_dim_order: impl ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_scalar_type = field_scalar_type
                    .prepare(builder, &super::executorch_flatbuffer::ScalarType::Byte);
                let prepared_sizes = field_sizes.prepare(builder);
                let prepared_dim_order = field_dim_order.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<10> =
                    ::core::default::Default::default();
                if prepared_sizes.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(1);
                }
                if prepared_dim_order.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u8]>>(2);
                }
                if prepared_scalar_type.is_some() {
                    table_writer.write_entry::<super::executorch_flatbuffer::ScalarType>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_sizes) = prepared_sizes {
                            object_writer.write::<_, _, 4>(&prepared_sizes);
                        }
                        if let ::core::option::Option::Some(prepared_dim_order) = prepared_dim_order
                        {
                            object_writer.write::<_, _, 4>(&prepared_dim_order);
                        }
                        if let ::core::option::Option::Some(prepared_scalar_type) =
                            prepared_scalar_type
                        {
                            object_writer.write::<_, _, 1>(&prepared_scalar_type);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<TensorLayout>> for TensorLayout {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<TensorLayout> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<TensorLayout>> for TensorLayout {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<TensorLayout>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<TensorLayout> for TensorLayout {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<TensorLayout> {
                TensorLayout::create(builder, self.scalar_type, &self.sizes, &self.dim_order)
            }
        }

        /// Builder for serializing an instance of the [TensorLayout] type.
        ///
        /// Can be created using the [TensorLayout::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct TensorLayoutBuilder<State>(State);

        impl TensorLayoutBuilder<()> {
            /// Setter for the [`scalar_type` field](TensorLayout#structfield.scalar_type).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scalar_type<T0>(self, value: T0) -> TensorLayoutBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<
                    super::executorch_flatbuffer::ScalarType,
                    super::executorch_flatbuffer::ScalarType,
                >,
            {
                TensorLayoutBuilder((value,))
            }

            /// Sets the [`scalar_type` field](TensorLayout#structfield.scalar_type) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scalar_type_as_default(self) -> TensorLayoutBuilder<(::planus::DefaultValue,)> {
                self.scalar_type(::planus::DefaultValue)
            }
        }

        impl<T0> TensorLayoutBuilder<(T0,)> {
            /// Setter for the [`sizes` field](TensorLayout#structfield.sizes).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn sizes<T1>(self, value: T1) -> TensorLayoutBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                let (v0,) = self.0;
                TensorLayoutBuilder((v0, value))
            }

            /// Sets the [`sizes` field](TensorLayout#structfield.sizes) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn sizes_as_null(self) -> TensorLayoutBuilder<(T0, ())> {
                self.sizes(())
            }
        }

        impl<T0, T1> TensorLayoutBuilder<(T0, T1)> {
            /// Setter for the [`dim_order` field](TensorLayout#structfield.dim_order).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dim_order<T2>(self, value: T2) -> TensorLayoutBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            {
                let (v0, v1) = self.0;
                TensorLayoutBuilder((v0, v1, value))
            }

            /// Sets the [`dim_order` field](TensorLayout#structfield.dim_order) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dim_order_as_null(self) -> TensorLayoutBuilder<(T0, T1, ())> {
                self.dim_order(())
            }
        }

        impl<T0, T1, T2> TensorLayoutBuilder<(T0, T1, T2)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [TensorLayout].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<TensorLayout>
            where
                Self: ::planus::WriteAsOffset<TensorLayout>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<
                    super::executorch_flatbuffer::ScalarType,
                    super::executorch_flatbuffer::ScalarType,
                >,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAs<::planus::Offset<TensorLayout>>
            for TensorLayoutBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<TensorLayout>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<TensorLayout> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<
                    super::executorch_flatbuffer::ScalarType,
                    super::executorch_flatbuffer::ScalarType,
                >,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAsOptional<::planus::Offset<TensorLayout>>
            for TensorLayoutBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<TensorLayout>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<TensorLayout>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<
                    super::executorch_flatbuffer::ScalarType,
                    super::executorch_flatbuffer::ScalarType,
                >,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAsOffset<TensorLayout> for TensorLayoutBuilder<(T0, T1, T2)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<TensorLayout> {
                let (v0, v1, v2) = &self.0;
                TensorLayout::create(builder, v0, v1, v2)
            }
        }

        /// Reference to a deserialized [TensorLayout].
        #[derive(Copy, Clone)]
        pub struct TensorLayoutRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> TensorLayoutRef<'a> {
            /// Getter for the [`scalar_type` field](TensorLayout#structfield.scalar_type).
            #[inline]
            pub fn scalar_type(
                &self,
            ) -> ::planus::Result<super::executorch_flatbuffer::ScalarType> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "TensorLayout", "scalar_type")?
                        .unwrap_or(super::executorch_flatbuffer::ScalarType::Byte),
                )
            }

            /// Getter for the [`sizes` field](TensorLayout#structfield.sizes).
            #[inline]
            pub fn sizes(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(1, "TensorLayout", "sizes")
            }

            /// Getter for the [`dim_order` field](TensorLayout#structfield.dim_order).
            #[inline]
            pub fn dim_order(&self) -> ::planus::Result<::core::option::Option<&'a [u8]>> {
                self.0.access(2, "TensorLayout", "dim_order")
            }
        }

        impl<'a> ::core::fmt::Debug for TensorLayoutRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("TensorLayoutRef");
                f.field("scalar_type", &self.scalar_type());
                if let ::core::option::Option::Some(field_sizes) = self.sizes().transpose() {
                    f.field("sizes", &field_sizes);
                }
                if let ::core::option::Option::Some(field_dim_order) = self.dim_order().transpose()
                {
                    f.field("dim_order", &field_dim_order);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<TensorLayoutRef<'a>> for TensorLayout {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: TensorLayoutRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    scalar_type: ::core::convert::TryInto::try_into(value.scalar_type()?)?,
                    sizes: if let ::core::option::Option::Some(sizes) = value.sizes()? {
                        ::core::option::Option::Some(sizes.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    dim_order: value.dim_order()?.map(|v| v.to_vec()),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for TensorLayoutRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for TensorLayoutRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[TensorLayoutRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<TensorLayout>> for TensorLayout {
            type Value = ::planus::Offset<TensorLayout>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<TensorLayout>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for TensorLayoutRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[TensorLayoutRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `DataSegment` in the namespace `flat_tensor_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `DataSegment` in the file `schema/flat_tensor.fbs:16`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct DataSegment {
            /// The field `offset` in the table `DataSegment`
            pub offset: u64,
            /// The field `size` in the table `DataSegment`
            pub size: u64,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for DataSegment {
            fn default() -> Self {
                Self { offset: 0, size: 0 }
            }
        }

        impl DataSegment {
            /// Creates a [DataSegmentBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> DataSegmentBuilder<()> {
                DataSegmentBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_offset: impl ::planus::WriteAsDefault<u64, u64>,
                field_size: impl ::planus::WriteAsDefault<u64, u64>,
            ) -> ::planus::Offset<Self> {
                let prepared_offset = field_offset.prepare(builder, &0);
                let prepared_size = field_size.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_offset.is_some() {
                    table_writer.write_entry::<u64>(0);
                }
                if prepared_size.is_some() {
                    table_writer.write_entry::<u64>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_offset) = prepared_offset {
                            object_writer.write::<_, _, 8>(&prepared_offset);
                        }
                        if let ::core::option::Option::Some(prepared_size) = prepared_size {
                            object_writer.write::<_, _, 8>(&prepared_size);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<DataSegment>> for DataSegment {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DataSegment> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<DataSegment>> for DataSegment {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<DataSegment>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<DataSegment> for DataSegment {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DataSegment> {
                DataSegment::create(builder, self.offset, self.size)
            }
        }

        /// Builder for serializing an instance of the [DataSegment] type.
        ///
        /// Can be created using the [DataSegment::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct DataSegmentBuilder<State>(State);

        impl DataSegmentBuilder<()> {
            /// Setter for the [`offset` field](DataSegment#structfield.offset).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn offset<T0>(self, value: T0) -> DataSegmentBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u64, u64>,
            {
                DataSegmentBuilder((value,))
            }

            /// Sets the [`offset` field](DataSegment#structfield.offset) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn offset_as_default(self) -> DataSegmentBuilder<(::planus::DefaultValue,)> {
                self.offset(::planus::DefaultValue)
            }
        }

        impl<T0> DataSegmentBuilder<(T0,)> {
            /// Setter for the [`size` field](DataSegment#structfield.size).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn size<T1>(self, value: T1) -> DataSegmentBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u64, u64>,
            {
                let (v0,) = self.0;
                DataSegmentBuilder((v0, value))
            }

            /// Sets the [`size` field](DataSegment#structfield.size) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn size_as_default(self) -> DataSegmentBuilder<(T0, ::planus::DefaultValue)> {
                self.size(::planus::DefaultValue)
            }
        }

        impl<T0, T1> DataSegmentBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [DataSegment].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<DataSegment>
            where
                Self: ::planus::WriteAsOffset<DataSegment>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<u64, u64>, T1: ::planus::WriteAsDefault<u64, u64>>
            ::planus::WriteAs<::planus::Offset<DataSegment>> for DataSegmentBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<DataSegment>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DataSegment> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<u64, u64>, T1: ::planus::WriteAsDefault<u64, u64>>
            ::planus::WriteAsOptional<::planus::Offset<DataSegment>>
            for DataSegmentBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<DataSegment>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<DataSegment>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<u64, u64>, T1: ::planus::WriteAsDefault<u64, u64>>
            ::planus::WriteAsOffset<DataSegment> for DataSegmentBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<DataSegment> {
                let (v0, v1) = &self.0;
                DataSegment::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [DataSegment].
        #[derive(Copy, Clone)]
        pub struct DataSegmentRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> DataSegmentRef<'a> {
            /// Getter for the [`offset` field](DataSegment#structfield.offset).
            #[inline]
            pub fn offset(&self) -> ::planus::Result<u64> {
                ::core::result::Result::Ok(self.0.access(0, "DataSegment", "offset")?.unwrap_or(0))
            }

            /// Getter for the [`size` field](DataSegment#structfield.size).
            #[inline]
            pub fn size(&self) -> ::planus::Result<u64> {
                ::core::result::Result::Ok(self.0.access(1, "DataSegment", "size")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for DataSegmentRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("DataSegmentRef");
                f.field("offset", &self.offset());
                f.field("size", &self.size());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<DataSegmentRef<'a>> for DataSegment {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: DataSegmentRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    offset: ::core::convert::TryInto::try_into(value.offset()?)?,
                    size: ::core::convert::TryInto::try_into(value.size()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for DataSegmentRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for DataSegmentRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[DataSegmentRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<DataSegment>> for DataSegment {
            type Value = ::planus::Offset<DataSegment>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<DataSegment>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for DataSegmentRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[DataSegmentRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `NamedData` in the namespace `flat_tensor_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `NamedData` in the file `schema/flat_tensor.fbs:21`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct NamedData {
            /// The field `key` in the table `NamedData`
            pub key: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `segment_index` in the table `NamedData`
            pub segment_index: u32,
            /// The field `tensor_layout` in the table `NamedData`
            pub tensor_layout:
                ::core::option::Option<::planus::alloc::boxed::Box<self::TensorLayout>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for NamedData {
            fn default() -> Self {
                Self {
                    key: ::core::default::Default::default(),
                    segment_index: 0,
                    tensor_layout: ::core::default::Default::default(),
                }
            }
        }

        impl NamedData {
            /// Creates a [NamedDataBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> NamedDataBuilder<()> {
                NamedDataBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_key: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                field_segment_index: impl ::planus::WriteAsDefault<u32, u32>,
                field_tensor_layout: impl ::planus::WriteAsOptional<
                    ::planus::Offset<self::TensorLayout>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_key = field_key.prepare(builder);
                let prepared_segment_index = field_segment_index.prepare(builder, &0);
                let prepared_tensor_layout = field_tensor_layout.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<10> =
                    ::core::default::Default::default();
                if prepared_key.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }
                if prepared_segment_index.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_tensor_layout.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::TensorLayout>>(2);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_key) = prepared_key {
                            object_writer.write::<_, _, 4>(&prepared_key);
                        }
                        if let ::core::option::Option::Some(prepared_segment_index) =
                            prepared_segment_index
                        {
                            object_writer.write::<_, _, 4>(&prepared_segment_index);
                        }
                        if let ::core::option::Option::Some(prepared_tensor_layout) =
                            prepared_tensor_layout
                        {
                            object_writer.write::<_, _, 4>(&prepared_tensor_layout);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<NamedData>> for NamedData {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<NamedData> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<NamedData>> for NamedData {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<NamedData>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<NamedData> for NamedData {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<NamedData> {
                NamedData::create(builder, &self.key, self.segment_index, &self.tensor_layout)
            }
        }

        /// Builder for serializing an instance of the [NamedData] type.
        ///
        /// Can be created using the [NamedData::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct NamedDataBuilder<State>(State);

        impl NamedDataBuilder<()> {
            /// Setter for the [`key` field](NamedData#structfield.key).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn key<T0>(self, value: T0) -> NamedDataBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                NamedDataBuilder((value,))
            }

            /// Sets the [`key` field](NamedData#structfield.key) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn key_as_null(self) -> NamedDataBuilder<((),)> {
                self.key(())
            }
        }

        impl<T0> NamedDataBuilder<(T0,)> {
            /// Setter for the [`segment_index` field](NamedData#structfield.segment_index).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn segment_index<T1>(self, value: T1) -> NamedDataBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                NamedDataBuilder((v0, value))
            }

            /// Sets the [`segment_index` field](NamedData#structfield.segment_index) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn segment_index_as_default(
                self,
            ) -> NamedDataBuilder<(T0, ::planus::DefaultValue)> {
                self.segment_index(::planus::DefaultValue)
            }
        }

        impl<T0, T1> NamedDataBuilder<(T0, T1)> {
            /// Setter for the [`tensor_layout` field](NamedData#structfield.tensor_layout).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn tensor_layout<T2>(self, value: T2) -> NamedDataBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<self::TensorLayout>>,
            {
                let (v0, v1) = self.0;
                NamedDataBuilder((v0, v1, value))
            }

            /// Sets the [`tensor_layout` field](NamedData#structfield.tensor_layout) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn tensor_layout_as_null(self) -> NamedDataBuilder<(T0, T1, ())> {
                self.tensor_layout(())
            }
        }

        impl<T0, T1, T2> NamedDataBuilder<(T0, T1, T2)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [NamedData].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<NamedData>
            where
                Self: ::planus::WriteAsOffset<NamedData>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<self::TensorLayout>>,
            > ::planus::WriteAs<::planus::Offset<NamedData>> for NamedDataBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<NamedData>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<NamedData> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<self::TensorLayout>>,
            > ::planus::WriteAsOptional<::planus::Offset<NamedData>>
            for NamedDataBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<NamedData>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<NamedData>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<self::TensorLayout>>,
            > ::planus::WriteAsOffset<NamedData> for NamedDataBuilder<(T0, T1, T2)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<NamedData> {
                let (v0, v1, v2) = &self.0;
                NamedData::create(builder, v0, v1, v2)
            }
        }

        /// Reference to a deserialized [NamedData].
        #[derive(Copy, Clone)]
        pub struct NamedDataRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> NamedDataRef<'a> {
            /// Getter for the [`key` field](NamedData#structfield.key).
            #[inline]
            pub fn key(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "NamedData", "key")
            }

            /// Getter for the [`segment_index` field](NamedData#structfield.segment_index).
            #[inline]
            pub fn segment_index(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(1, "NamedData", "segment_index")?.unwrap_or(0),
                )
            }

            /// Getter for the [`tensor_layout` field](NamedData#structfield.tensor_layout).
            #[inline]
            pub fn tensor_layout(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::TensorLayoutRef<'a>>> {
                self.0.access(2, "NamedData", "tensor_layout")
            }
        }

        impl<'a> ::core::fmt::Debug for NamedDataRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("NamedDataRef");
                if let ::core::option::Option::Some(field_key) = self.key().transpose() {
                    f.field("key", &field_key);
                }
                f.field("segment_index", &self.segment_index());
                if let ::core::option::Option::Some(field_tensor_layout) =
                    self.tensor_layout().transpose()
                {
                    f.field("tensor_layout", &field_tensor_layout);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<NamedDataRef<'a>> for NamedData {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: NamedDataRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    key: value.key()?.map(::core::convert::Into::into),
                    segment_index: ::core::convert::TryInto::try_into(value.segment_index()?)?,
                    tensor_layout: if let ::core::option::Option::Some(tensor_layout) =
                        value.tensor_layout()?
                    {
                        ::core::option::Option::Some(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryInto::try_into(tensor_layout)?,
                        ))
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for NamedDataRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for NamedDataRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[NamedDataRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<NamedData>> for NamedData {
            type Value = ::planus::Offset<NamedData>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<NamedData>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for NamedDataRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[NamedDataRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `FlatTensor` in the namespace `flat_tensor_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `FlatTensor` in the file `schema/flat_tensor.fbs:28`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct FlatTensor {
            /// The field `version` in the table `FlatTensor`
            pub version: u32,
            /// The field `segments` in the table `FlatTensor`
            pub segments: ::core::option::Option<::planus::alloc::vec::Vec<self::DataSegment>>,
            /// The field `named_data` in the table `FlatTensor`
            pub named_data: ::core::option::Option<::planus::alloc::vec::Vec<self::NamedData>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for FlatTensor {
            fn default() -> Self {
                Self {
                    version: 0,
                    segments: ::core::default::Default::default(),
                    named_data: ::core::default::Default::default(),
                }
            }
        }

        impl FlatTensor {
            /// Creates a [FlatTensorBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> FlatTensorBuilder<()> {
                FlatTensorBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_version: impl ::planus::WriteAsDefault<u32, u32>,
                field_segments: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::DataSegment>]>,
                >,
                field_named_data: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::NamedData>]>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_version = field_version.prepare(builder, &0);
                let prepared_segments = field_segments.prepare(builder);
                let prepared_named_data = field_named_data.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<10> =
                    ::core::default::Default::default();
                if prepared_version.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_segments.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::DataSegment>]>>(1);
                }
                if prepared_named_data.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::NamedData>]>>(2);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_version) = prepared_version {
                            object_writer.write::<_, _, 4>(&prepared_version);
                        }
                        if let ::core::option::Option::Some(prepared_segments) = prepared_segments {
                            object_writer.write::<_, _, 4>(&prepared_segments);
                        }
                        if let ::core::option::Option::Some(prepared_named_data) =
                            prepared_named_data
                        {
                            object_writer.write::<_, _, 4>(&prepared_named_data);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<FlatTensor>> for FlatTensor {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FlatTensor> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<FlatTensor>> for FlatTensor {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<FlatTensor>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<FlatTensor> for FlatTensor {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FlatTensor> {
                FlatTensor::create(builder, self.version, &self.segments, &self.named_data)
            }
        }

        /// Builder for serializing an instance of the [FlatTensor] type.
        ///
        /// Can be created using the [FlatTensor::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct FlatTensorBuilder<State>(State);

        impl FlatTensorBuilder<()> {
            /// Setter for the [`version` field](FlatTensor#structfield.version).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn version<T0>(self, value: T0) -> FlatTensorBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                FlatTensorBuilder((value,))
            }

            /// Sets the [`version` field](FlatTensor#structfield.version) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn version_as_default(self) -> FlatTensorBuilder<(::planus::DefaultValue,)> {
                self.version(::planus::DefaultValue)
            }
        }

        impl<T0> FlatTensorBuilder<(T0,)> {
            /// Setter for the [`segments` field](FlatTensor#structfield.segments).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn segments<T1>(self, value: T1) -> FlatTensorBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::DataSegment>]>,
                >,
            {
                let (v0,) = self.0;
                FlatTensorBuilder((v0, value))
            }

            /// Sets the [`segments` field](FlatTensor#structfield.segments) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn segments_as_null(self) -> FlatTensorBuilder<(T0, ())> {
                self.segments(())
            }
        }

        impl<T0, T1> FlatTensorBuilder<(T0, T1)> {
            /// Setter for the [`named_data` field](FlatTensor#structfield.named_data).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn named_data<T2>(self, value: T2) -> FlatTensorBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::NamedData>]>,
                >,
            {
                let (v0, v1) = self.0;
                FlatTensorBuilder((v0, v1, value))
            }

            /// Sets the [`named_data` field](FlatTensor#structfield.named_data) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn named_data_as_null(self) -> FlatTensorBuilder<(T0, T1, ())> {
                self.named_data(())
            }
        }

        impl<T0, T1, T2> FlatTensorBuilder<(T0, T1, T2)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [FlatTensor].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<FlatTensor>
            where
                Self: ::planus::WriteAsOffset<FlatTensor>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::DataSegment>]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::NamedData>]>>,
            > ::planus::WriteAs<::planus::Offset<FlatTensor>> for FlatTensorBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<FlatTensor>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FlatTensor> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::DataSegment>]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::NamedData>]>>,
            > ::planus::WriteAsOptional<::planus::Offset<FlatTensor>>
            for FlatTensorBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<FlatTensor>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<FlatTensor>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::DataSegment>]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::NamedData>]>>,
            > ::planus::WriteAsOffset<FlatTensor> for FlatTensorBuilder<(T0, T1, T2)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<FlatTensor> {
                let (v0, v1, v2) = &self.0;
                FlatTensor::create(builder, v0, v1, v2)
            }
        }

        /// Reference to a deserialized [FlatTensor].
        #[derive(Copy, Clone)]
        pub struct FlatTensorRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> FlatTensorRef<'a> {
            /// Getter for the [`version` field](FlatTensor#structfield.version).
            #[inline]
            pub fn version(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(0, "FlatTensor", "version")?.unwrap_or(0))
            }

            /// Getter for the [`segments` field](FlatTensor#structfield.segments).
            #[inline]
            pub fn segments(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::DataSegmentRef<'a>>>,
                >,
            > {
                self.0.access(1, "FlatTensor", "segments")
            }

            /// Getter for the [`named_data` field](FlatTensor#structfield.named_data).
            #[inline]
            pub fn named_data(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::NamedDataRef<'a>>>,
                >,
            > {
                self.0.access(2, "FlatTensor", "named_data")
            }
        }

        impl<'a> ::core::fmt::Debug for FlatTensorRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("FlatTensorRef");
                f.field("version", &self.version());
                if let ::core::option::Option::Some(field_segments) = self.segments().transpose() {
                    f.field("segments", &field_segments);
                }
                if let ::core::option::Option::Some(field_named_data) =
                    self.named_data().transpose()
                {
                    f.field("named_data", &field_named_data);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<FlatTensorRef<'a>> for FlatTensor {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: FlatTensorRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    version: ::core::convert::TryInto::try_into(value.version()?)?,
                    segments: if let ::core::option::Option::Some(segments) = value.segments()? {
                        ::core::option::Option::Some(segments.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    named_data: if let ::core::option::Option::Some(named_data) =
                        value.named_data()?
                    {
                        ::core::option::Option::Some(named_data.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for FlatTensorRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for FlatTensorRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[FlatTensorRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<FlatTensor>> for FlatTensor {
            type Value = ::planus::Offset<FlatTensor>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<FlatTensor>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for FlatTensorRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[FlatTensorRef]", "read_as_root", 0)
                })
            }
        }
    }
    /// The namespace `bundled_program_flatbuffer`
    ///
    /// Generated from these locations:
    /// * File `schema/bundled_program.fbs`
    pub mod bundled_program_flatbuffer {
        /// The table `Tensor` in the namespace `bundled_program_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Tensor` in the file `schema/bundled_program.fbs:9`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Tensor {
            /// The field `scalar_type` in the table `Tensor`
            pub scalar_type: super::executorch_flatbuffer::ScalarType,
            /// The field `sizes` in the table `Tensor`
            pub sizes: ::core::option::Option<::planus::alloc::vec::Vec<i32>>,
            /// The field `data` in the table `Tensor`
            pub data: ::core::option::Option<::planus::alloc::vec::Vec<u8>>,
            /// The field `dim_order` in the table `Tensor`
            pub dim_order: ::core::option::Option<::planus::alloc::vec::Vec<u8>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Tensor {
            fn default() -> Self {
                Self {
                    scalar_type: super::executorch_flatbuffer::ScalarType::Byte,
                    sizes: ::core::default::Default::default(),
                    data: ::core::default::Default::default(),
                    dim_order: ::core::default::Default::default(),
                }
            }
        }

        impl Tensor {
            /// Creates a [TensorBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> TensorBuilder<()> {
                TensorBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_scalar_type: impl ::planus::WriteAsDefault<
                    super::executorch_flatbuffer::ScalarType,
                    super::executorch_flatbuffer::ScalarType,
                >,
                field_sizes: impl ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                field_data: impl ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
                field_dim_order: impl ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_scalar_type = field_scalar_type
                    .prepare(builder, &super::executorch_flatbuffer::ScalarType::Byte);
                let prepared_sizes = field_sizes.prepare(builder);
                let prepared_data = field_data.prepare(builder);
                let prepared_dim_order = field_dim_order.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<12> =
                    ::core::default::Default::default();
                if prepared_sizes.is_some() {
                    table_writer.write_entry::<::planus::Offset<[i32]>>(1);
                }
                if prepared_data.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u8]>>(2);
                }
                if prepared_dim_order.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u8]>>(3);
                }
                if prepared_scalar_type.is_some() {
                    table_writer.write_entry::<super::executorch_flatbuffer::ScalarType>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_sizes) = prepared_sizes {
                            object_writer.write::<_, _, 4>(&prepared_sizes);
                        }
                        if let ::core::option::Option::Some(prepared_data) = prepared_data {
                            object_writer.write::<_, _, 4>(&prepared_data);
                        }
                        if let ::core::option::Option::Some(prepared_dim_order) = prepared_dim_order
                        {
                            object_writer.write::<_, _, 4>(&prepared_dim_order);
                        }
                        if let ::core::option::Option::Some(prepared_scalar_type) =
                            prepared_scalar_type
                        {
                            object_writer.write::<_, _, 1>(&prepared_scalar_type);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Tensor>> for Tensor {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Tensor> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Tensor>> for Tensor {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Tensor>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Tensor> for Tensor {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Tensor> {
                Tensor::create(
                    builder,
                    self.scalar_type,
                    &self.sizes,
                    &self.data,
                    &self.dim_order,
                )
            }
        }

        /// Builder for serializing an instance of the [Tensor] type.
        ///
        /// Can be created using the [Tensor::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct TensorBuilder<State>(State);

        impl TensorBuilder<()> {
            /// Setter for the [`scalar_type` field](Tensor#structfield.scalar_type).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scalar_type<T0>(self, value: T0) -> TensorBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<
                    super::executorch_flatbuffer::ScalarType,
                    super::executorch_flatbuffer::ScalarType,
                >,
            {
                TensorBuilder((value,))
            }

            /// Sets the [`scalar_type` field](Tensor#structfield.scalar_type) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scalar_type_as_default(self) -> TensorBuilder<(::planus::DefaultValue,)> {
                self.scalar_type(::planus::DefaultValue)
            }
        }

        impl<T0> TensorBuilder<(T0,)> {
            /// Setter for the [`sizes` field](Tensor#structfield.sizes).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn sizes<T1>(self, value: T1) -> TensorBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
            {
                let (v0,) = self.0;
                TensorBuilder((v0, value))
            }

            /// Sets the [`sizes` field](Tensor#structfield.sizes) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn sizes_as_null(self) -> TensorBuilder<(T0, ())> {
                self.sizes(())
            }
        }

        impl<T0, T1> TensorBuilder<(T0, T1)> {
            /// Setter for the [`data` field](Tensor#structfield.data).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn data<T2>(self, value: T2) -> TensorBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            {
                let (v0, v1) = self.0;
                TensorBuilder((v0, v1, value))
            }

            /// Sets the [`data` field](Tensor#structfield.data) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn data_as_null(self) -> TensorBuilder<(T0, T1, ())> {
                self.data(())
            }
        }

        impl<T0, T1, T2> TensorBuilder<(T0, T1, T2)> {
            /// Setter for the [`dim_order` field](Tensor#structfield.dim_order).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dim_order<T3>(self, value: T3) -> TensorBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            {
                let (v0, v1, v2) = self.0;
                TensorBuilder((v0, v1, v2, value))
            }

            /// Sets the [`dim_order` field](Tensor#structfield.dim_order) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dim_order_as_null(self) -> TensorBuilder<(T0, T1, T2, ())> {
                self.dim_order(())
            }
        }

        impl<T0, T1, T2, T3> TensorBuilder<(T0, T1, T2, T3)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Tensor].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Tensor>
            where
                Self: ::planus::WriteAsOffset<Tensor>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<
                    super::executorch_flatbuffer::ScalarType,
                    super::executorch_flatbuffer::ScalarType,
                >,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAs<::planus::Offset<Tensor>> for TensorBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<Tensor>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Tensor> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<
                    super::executorch_flatbuffer::ScalarType,
                    super::executorch_flatbuffer::ScalarType,
                >,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAsOptional<::planus::Offset<Tensor>>
            for TensorBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<Tensor>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Tensor>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<
                    super::executorch_flatbuffer::ScalarType,
                    super::executorch_flatbuffer::ScalarType,
                >,
                T1: ::planus::WriteAsOptional<::planus::Offset<[i32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
                T3: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAsOffset<Tensor> for TensorBuilder<(T0, T1, T2, T3)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Tensor> {
                let (v0, v1, v2, v3) = &self.0;
                Tensor::create(builder, v0, v1, v2, v3)
            }
        }

        /// Reference to a deserialized [Tensor].
        #[derive(Copy, Clone)]
        pub struct TensorRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> TensorRef<'a> {
            /// Getter for the [`scalar_type` field](Tensor#structfield.scalar_type).
            #[inline]
            pub fn scalar_type(
                &self,
            ) -> ::planus::Result<super::executorch_flatbuffer::ScalarType> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "Tensor", "scalar_type")?
                        .unwrap_or(super::executorch_flatbuffer::ScalarType::Byte),
                )
            }

            /// Getter for the [`sizes` field](Tensor#structfield.sizes).
            #[inline]
            pub fn sizes(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, i32>>> {
                self.0.access(1, "Tensor", "sizes")
            }

            /// Getter for the [`data` field](Tensor#structfield.data).
            #[inline]
            pub fn data(&self) -> ::planus::Result<::core::option::Option<&'a [u8]>> {
                self.0.access(2, "Tensor", "data")
            }

            /// Getter for the [`dim_order` field](Tensor#structfield.dim_order).
            #[inline]
            pub fn dim_order(&self) -> ::planus::Result<::core::option::Option<&'a [u8]>> {
                self.0.access(3, "Tensor", "dim_order")
            }
        }

        impl<'a> ::core::fmt::Debug for TensorRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("TensorRef");
                f.field("scalar_type", &self.scalar_type());
                if let ::core::option::Option::Some(field_sizes) = self.sizes().transpose() {
                    f.field("sizes", &field_sizes);
                }
                if let ::core::option::Option::Some(field_data) = self.data().transpose() {
                    f.field("data", &field_data);
                }
                if let ::core::option::Option::Some(field_dim_order) = self.dim_order().transpose()
                {
                    f.field("dim_order", &field_dim_order);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<TensorRef<'a>> for Tensor {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: TensorRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    scalar_type: ::core::convert::TryInto::try_into(value.scalar_type()?)?,
                    sizes: if let ::core::option::Option::Some(sizes) = value.sizes()? {
                        ::core::option::Option::Some(sizes.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    data: value.data()?.map(|v| v.to_vec()),
                    dim_order: value.dim_order()?.map(|v| v.to_vec()),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for TensorRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for TensorRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[TensorRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Tensor>> for Tensor {
            type Value = ::planus::Offset<Tensor>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Tensor>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for TensorRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[TensorRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Int` in the namespace `bundled_program_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Int` in the file `schema/bundled_program.fbs:16`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Int {
            /// The field `int_val` in the table `Int`
            pub int_val: i64,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Int {
            fn default() -> Self {
                Self { int_val: 0 }
            }
        }

        impl Int {
            /// Creates a [IntBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> IntBuilder<()> {
                IntBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_int_val: impl ::planus::WriteAsDefault<i64, i64>,
            ) -> ::planus::Offset<Self> {
                let prepared_int_val = field_int_val.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_int_val.is_some() {
                    table_writer.write_entry::<i64>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_int_val) = prepared_int_val {
                            object_writer.write::<_, _, 8>(&prepared_int_val);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Int>> for Int {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Int> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Int>> for Int {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Int>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Int> for Int {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Int> {
                Int::create(builder, self.int_val)
            }
        }

        /// Builder for serializing an instance of the [Int] type.
        ///
        /// Can be created using the [Int::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct IntBuilder<State>(State);

        impl IntBuilder<()> {
            /// Setter for the [`int_val` field](Int#structfield.int_val).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn int_val<T0>(self, value: T0) -> IntBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<i64, i64>,
            {
                IntBuilder((value,))
            }

            /// Sets the [`int_val` field](Int#structfield.int_val) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn int_val_as_default(self) -> IntBuilder<(::planus::DefaultValue,)> {
                self.int_val(::planus::DefaultValue)
            }
        }

        impl<T0> IntBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Int].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Int>
            where
                Self: ::planus::WriteAsOffset<Int>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i64, i64>> ::planus::WriteAs<::planus::Offset<Int>>
            for IntBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Int>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Int> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i64, i64>>
            ::planus::WriteAsOptional<::planus::Offset<Int>> for IntBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Int>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Int>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<i64, i64>> ::planus::WriteAsOffset<Int> for IntBuilder<(T0,)> {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Int> {
                let (v0,) = &self.0;
                Int::create(builder, v0)
            }
        }

        /// Reference to a deserialized [Int].
        #[derive(Copy, Clone)]
        pub struct IntRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> IntRef<'a> {
            /// Getter for the [`int_val` field](Int#structfield.int_val).
            #[inline]
            pub fn int_val(&self) -> ::planus::Result<i64> {
                ::core::result::Result::Ok(self.0.access(0, "Int", "int_val")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for IntRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("IntRef");
                f.field("int_val", &self.int_val());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<IntRef<'a>> for Int {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: IntRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    int_val: ::core::convert::TryInto::try_into(value.int_val()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for IntRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for IntRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[IntRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Int>> for Int {
            type Value = ::planus::Offset<Int>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Int>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for IntRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| error_kind.with_error_location("[IntRef]", "read_as_root", 0))
            }
        }

        /// The table `Bool` in the namespace `bundled_program_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Bool` in the file `schema/bundled_program.fbs:20`
        #[derive(
            Clone,
            Debug,
            PartialEq,
            PartialOrd,
            Eq,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        pub struct Bool {
            /// The field `bool_val` in the table `Bool`
            pub bool_val: bool,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Bool {
            fn default() -> Self {
                Self { bool_val: false }
            }
        }

        impl Bool {
            /// Creates a [BoolBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> BoolBuilder<()> {
                BoolBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_bool_val: impl ::planus::WriteAsDefault<bool, bool>,
            ) -> ::planus::Offset<Self> {
                let prepared_bool_val = field_bool_val.prepare(builder, &false);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_bool_val.is_some() {
                    table_writer.write_entry::<bool>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_bool_val) = prepared_bool_val {
                            object_writer.write::<_, _, 1>(&prepared_bool_val);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Bool>> for Bool {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Bool> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Bool>> for Bool {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Bool>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Bool> for Bool {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Bool> {
                Bool::create(builder, self.bool_val)
            }
        }

        /// Builder for serializing an instance of the [Bool] type.
        ///
        /// Can be created using the [Bool::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct BoolBuilder<State>(State);

        impl BoolBuilder<()> {
            /// Setter for the [`bool_val` field](Bool#structfield.bool_val).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn bool_val<T0>(self, value: T0) -> BoolBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<bool, bool>,
            {
                BoolBuilder((value,))
            }

            /// Sets the [`bool_val` field](Bool#structfield.bool_val) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn bool_val_as_default(self) -> BoolBuilder<(::planus::DefaultValue,)> {
                self.bool_val(::planus::DefaultValue)
            }
        }

        impl<T0> BoolBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Bool].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Bool>
            where
                Self: ::planus::WriteAsOffset<Bool>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<bool, bool>> ::planus::WriteAs<::planus::Offset<Bool>>
            for BoolBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Bool>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Bool> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<bool, bool>>
            ::planus::WriteAsOptional<::planus::Offset<Bool>> for BoolBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Bool>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Bool>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<bool, bool>> ::planus::WriteAsOffset<Bool>
            for BoolBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Bool> {
                let (v0,) = &self.0;
                Bool::create(builder, v0)
            }
        }

        /// Reference to a deserialized [Bool].
        #[derive(Copy, Clone)]
        pub struct BoolRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> BoolRef<'a> {
            /// Getter for the [`bool_val` field](Bool#structfield.bool_val).
            #[inline]
            pub fn bool_val(&self) -> ::planus::Result<bool> {
                ::core::result::Result::Ok(self.0.access(0, "Bool", "bool_val")?.unwrap_or(false))
            }
        }

        impl<'a> ::core::fmt::Debug for BoolRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("BoolRef");
                f.field("bool_val", &self.bool_val());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<BoolRef<'a>> for Bool {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: BoolRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    bool_val: ::core::convert::TryInto::try_into(value.bool_val()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for BoolRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for BoolRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[BoolRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Bool>> for Bool {
            type Value = ::planus::Offset<Bool>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Bool>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for BoolRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[BoolRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `Double` in the namespace `bundled_program_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Double` in the file `schema/bundled_program.fbs:24`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct Double {
            /// The field `double_val` in the table `Double`
            pub double_val: f64,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Double {
            fn default() -> Self {
                Self { double_val: 0.0 }
            }
        }

        impl Double {
            /// Creates a [DoubleBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> DoubleBuilder<()> {
                DoubleBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_double_val: impl ::planus::WriteAsDefault<f64, f64>,
            ) -> ::planus::Offset<Self> {
                let prepared_double_val = field_double_val.prepare(builder, &0.0);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_double_val.is_some() {
                    table_writer.write_entry::<f64>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_double_val) =
                            prepared_double_val
                        {
                            object_writer.write::<_, _, 8>(&prepared_double_val);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Double>> for Double {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Double> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Double>> for Double {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Double>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Double> for Double {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Double> {
                Double::create(builder, self.double_val)
            }
        }

        /// Builder for serializing an instance of the [Double] type.
        ///
        /// Can be created using the [Double::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct DoubleBuilder<State>(State);

        impl DoubleBuilder<()> {
            /// Setter for the [`double_val` field](Double#structfield.double_val).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn double_val<T0>(self, value: T0) -> DoubleBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<f64, f64>,
            {
                DoubleBuilder((value,))
            }

            /// Sets the [`double_val` field](Double#structfield.double_val) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn double_val_as_default(self) -> DoubleBuilder<(::planus::DefaultValue,)> {
                self.double_val(::planus::DefaultValue)
            }
        }

        impl<T0> DoubleBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Double].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Double>
            where
                Self: ::planus::WriteAsOffset<Double>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<f64, f64>> ::planus::WriteAs<::planus::Offset<Double>>
            for DoubleBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Double>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Double> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<f64, f64>>
            ::planus::WriteAsOptional<::planus::Offset<Double>> for DoubleBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Double>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Double>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<f64, f64>> ::planus::WriteAsOffset<Double>
            for DoubleBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Double> {
                let (v0,) = &self.0;
                Double::create(builder, v0)
            }
        }

        /// Reference to a deserialized [Double].
        #[derive(Copy, Clone)]
        pub struct DoubleRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> DoubleRef<'a> {
            /// Getter for the [`double_val` field](Double#structfield.double_val).
            #[inline]
            pub fn double_val(&self) -> ::planus::Result<f64> {
                ::core::result::Result::Ok(self.0.access(0, "Double", "double_val")?.unwrap_or(0.0))
            }
        }

        impl<'a> ::core::fmt::Debug for DoubleRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("DoubleRef");
                f.field("double_val", &self.double_val());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<DoubleRef<'a>> for Double {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: DoubleRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    double_val: ::core::convert::TryInto::try_into(value.double_val()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for DoubleRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for DoubleRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[DoubleRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Double>> for Double {
            type Value = ::planus::Offset<Double>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Double>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for DoubleRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[DoubleRef]", "read_as_root", 0)
                })
            }
        }

        /// The union `ValueUnion` in the namespace `bundled_program_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Union `ValueUnion` in the file `schema/bundled_program.fbs:28`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub enum ValueUnion {
            /// The variant of type `Tensor` in the union `ValueUnion`
            Tensor(::planus::alloc::boxed::Box<self::Tensor>),

            /// The variant of type `Int` in the union `ValueUnion`
            Int(::planus::alloc::boxed::Box<self::Int>),

            /// The variant of type `Bool` in the union `ValueUnion`
            Bool(::planus::alloc::boxed::Box<self::Bool>),

            /// The variant of type `Double` in the union `ValueUnion`
            Double(::planus::alloc::boxed::Box<self::Double>),
        }

        impl ValueUnion {
            /// Creates a [ValueUnionBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> ValueUnionBuilder<::planus::Uninitialized> {
                ValueUnionBuilder(::planus::Uninitialized)
            }

            #[inline]
            pub fn create_tensor(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::Tensor>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(1, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_int(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::Int>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(2, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_bool(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::Bool>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(3, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_double(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::Double>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(4, value.prepare(builder).downcast())
            }
        }

        impl ::planus::WriteAsUnion<ValueUnion> for ValueUnion {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::UnionOffset<Self> {
                match self {
                    Self::Tensor(value) => Self::create_tensor(builder, value),
                    Self::Int(value) => Self::create_int(builder, value),
                    Self::Bool(value) => Self::create_bool(builder, value),
                    Self::Double(value) => Self::create_double(builder, value),
                }
            }
        }

        impl ::planus::WriteAsOptionalUnion<ValueUnion> for ValueUnion {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<Self>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Builder for serializing an instance of the [ValueUnion] type.
        ///
        /// Can be created using the [ValueUnion::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct ValueUnionBuilder<T>(T);

        impl ValueUnionBuilder<::planus::Uninitialized> {
            /// Creates an instance of the [`Tensor` variant](ValueUnion#variant.Tensor).
            #[inline]
            pub fn tensor<T>(self, value: T) -> ValueUnionBuilder<::planus::Initialized<1, T>>
            where
                T: ::planus::WriteAsOffset<self::Tensor>,
            {
                ValueUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`Int` variant](ValueUnion#variant.Int).
            #[inline]
            pub fn int<T>(self, value: T) -> ValueUnionBuilder<::planus::Initialized<2, T>>
            where
                T: ::planus::WriteAsOffset<self::Int>,
            {
                ValueUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`Bool` variant](ValueUnion#variant.Bool).
            #[inline]
            pub fn bool<T>(self, value: T) -> ValueUnionBuilder<::planus::Initialized<3, T>>
            where
                T: ::planus::WriteAsOffset<self::Bool>,
            {
                ValueUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`Double` variant](ValueUnion#variant.Double).
            #[inline]
            pub fn double<T>(self, value: T) -> ValueUnionBuilder<::planus::Initialized<4, T>>
            where
                T: ::planus::WriteAsOffset<self::Double>,
            {
                ValueUnionBuilder(::planus::Initialized(value))
            }
        }

        impl<const N: u8, T> ValueUnionBuilder<::planus::Initialized<N, T>> {
            /// Finish writing the builder to get an [UnionOffset](::planus::UnionOffset) to a serialized [ValueUnion].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<ValueUnion>
            where
                Self: ::planus::WriteAsUnion<ValueUnion>,
            {
                ::planus::WriteAsUnion::prepare(&self, builder)
            }
        }

        impl<T> ::planus::WriteAsUnion<ValueUnion> for ValueUnionBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::Tensor>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<ValueUnion> {
                ::planus::UnionOffset::new(1, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<ValueUnion>
            for ValueUnionBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::Tensor>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<ValueUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<ValueUnion> for ValueUnionBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::Int>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<ValueUnion> {
                ::planus::UnionOffset::new(2, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<ValueUnion>
            for ValueUnionBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::Int>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<ValueUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<ValueUnion> for ValueUnionBuilder<::planus::Initialized<3, T>>
        where
            T: ::planus::WriteAsOffset<self::Bool>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<ValueUnion> {
                ::planus::UnionOffset::new(3, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<ValueUnion>
            for ValueUnionBuilder<::planus::Initialized<3, T>>
        where
            T: ::planus::WriteAsOffset<self::Bool>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<ValueUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<ValueUnion> for ValueUnionBuilder<::planus::Initialized<4, T>>
        where
            T: ::planus::WriteAsOffset<self::Double>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<ValueUnion> {
                ::planus::UnionOffset::new(4, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<ValueUnion>
            for ValueUnionBuilder<::planus::Initialized<4, T>>
        where
            T: ::planus::WriteAsOffset<self::Double>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<ValueUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Reference to a deserialized [ValueUnion].
        #[derive(Copy, Clone, Debug)]
        pub enum ValueUnionRef<'a> {
            Tensor(self::TensorRef<'a>),
            Int(self::IntRef<'a>),
            Bool(self::BoolRef<'a>),
            Double(self::DoubleRef<'a>),
        }

        impl<'a> ::core::convert::TryFrom<ValueUnionRef<'a>> for ValueUnion {
            type Error = ::planus::Error;

            fn try_from(value: ValueUnionRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(match value {
                    ValueUnionRef::Tensor(value) => Self::Tensor(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    ValueUnionRef::Int(value) => Self::Int(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    ValueUnionRef::Bool(value) => Self::Bool(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    ValueUnionRef::Double(value) => Self::Double(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),
                })
            }
        }

        impl<'a> ::planus::TableReadUnion<'a> for ValueUnionRef<'a> {
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                tag: u8,
                field_offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                match tag {
                    1 => ::core::result::Result::Ok(Self::Tensor(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    2 => ::core::result::Result::Ok(Self::Int(::planus::TableRead::from_buffer(
                        buffer,
                        field_offset,
                    )?)),
                    3 => ::core::result::Result::Ok(Self::Bool(::planus::TableRead::from_buffer(
                        buffer,
                        field_offset,
                    )?)),
                    4 => ::core::result::Result::Ok(Self::Double(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    _ => {
                        ::core::result::Result::Err(::planus::errors::ErrorKind::UnknownUnionTag {
                            tag,
                        })
                    }
                }
            }
        }

        impl<'a> ::planus::VectorReadUnion<'a> for ValueUnionRef<'a> {
            const VECTOR_NAME: &'static str = "[ValueUnionRef]";
        }

        /// The table `Value` in the namespace `bundled_program_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `Value` in the file `schema/bundled_program.fbs:35`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct Value {
            /// The field `val` in the table `Value`
            pub val: ::core::option::Option<self::ValueUnion>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Value {
            fn default() -> Self {
                Self {
                    val: ::core::default::Default::default(),
                }
            }
        }

        impl Value {
            /// Creates a [ValueBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> ValueBuilder<()> {
                ValueBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_val: impl ::planus::WriteAsOptionalUnion<self::ValueUnion>,
            ) -> ::planus::Offset<Self> {
                let prepared_val = field_val.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_val.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::ValueUnion>>(1);
                }
                if prepared_val.is_some() {
                    table_writer.write_entry::<u8>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_val) = prepared_val {
                            object_writer.write::<_, _, 4>(&prepared_val.offset());
                        }
                        if let ::core::option::Option::Some(prepared_val) = prepared_val {
                            object_writer.write::<_, _, 1>(&prepared_val.tag());
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Value>> for Value {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Value> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Value>> for Value {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Value>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Value> for Value {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Value> {
                Value::create(builder, &self.val)
            }
        }

        /// Builder for serializing an instance of the [Value] type.
        ///
        /// Can be created using the [Value::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct ValueBuilder<State>(State);

        impl ValueBuilder<()> {
            /// Setter for the [`val` field](Value#structfield.val).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn val<T0>(self, value: T0) -> ValueBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptionalUnion<self::ValueUnion>,
            {
                ValueBuilder((value,))
            }

            /// Sets the [`val` field](Value#structfield.val) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn val_as_null(self) -> ValueBuilder<((),)> {
                self.val(())
            }
        }

        impl<T0> ValueBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Value].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Value>
            where
                Self: ::planus::WriteAsOffset<Value>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::ValueUnion>>
            ::planus::WriteAs<::planus::Offset<Value>> for ValueBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Value>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Value> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::ValueUnion>>
            ::planus::WriteAsOptional<::planus::Offset<Value>> for ValueBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<Value>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Value>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::ValueUnion>> ::planus::WriteAsOffset<Value>
            for ValueBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Value> {
                let (v0,) = &self.0;
                Value::create(builder, v0)
            }
        }

        /// Reference to a deserialized [Value].
        #[derive(Copy, Clone)]
        pub struct ValueRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> ValueRef<'a> {
            /// Getter for the [`val` field](Value#structfield.val).
            #[inline]
            pub fn val(&self) -> ::planus::Result<::core::option::Option<self::ValueUnionRef<'a>>> {
                self.0.access_union(0, "Value", "val")
            }
        }

        impl<'a> ::core::fmt::Debug for ValueRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("ValueRef");
                if let ::core::option::Option::Some(field_val) = self.val().transpose() {
                    f.field("val", &field_val);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<ValueRef<'a>> for Value {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: ValueRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    val: if let ::core::option::Option::Some(val) = value.val()? {
                        ::core::option::Option::Some(::core::convert::TryInto::try_into(val)?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for ValueRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for ValueRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[ValueRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Value>> for Value {
            type Value = ::planus::Offset<Value>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Value>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for ValueRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[ValueRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `BundledMethodTestCase` in the namespace `bundled_program_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `BundledMethodTestCase` in the file `schema/bundled_program.fbs:39`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct BundledMethodTestCase {
            /// The field `inputs` in the table `BundledMethodTestCase`
            pub inputs: ::core::option::Option<::planus::alloc::vec::Vec<self::Value>>,
            /// The field `expected_outputs` in the table `BundledMethodTestCase`
            pub expected_outputs: ::core::option::Option<::planus::alloc::vec::Vec<self::Value>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for BundledMethodTestCase {
            fn default() -> Self {
                Self {
                    inputs: ::core::default::Default::default(),
                    expected_outputs: ::core::default::Default::default(),
                }
            }
        }

        impl BundledMethodTestCase {
            /// Creates a [BundledMethodTestCaseBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> BundledMethodTestCaseBuilder<()> {
                BundledMethodTestCaseBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_inputs: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::Value>]>,
                >,
                field_expected_outputs: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::Value>]>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_inputs = field_inputs.prepare(builder);
                let prepared_expected_outputs = field_expected_outputs.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_inputs.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::Value>]>>(0);
                }
                if prepared_expected_outputs.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::Value>]>>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_inputs) = prepared_inputs {
                            object_writer.write::<_, _, 4>(&prepared_inputs);
                        }
                        if let ::core::option::Option::Some(prepared_expected_outputs) =
                            prepared_expected_outputs
                        {
                            object_writer.write::<_, _, 4>(&prepared_expected_outputs);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<BundledMethodTestCase>> for BundledMethodTestCase {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BundledMethodTestCase> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<BundledMethodTestCase>> for BundledMethodTestCase {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BundledMethodTestCase>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<BundledMethodTestCase> for BundledMethodTestCase {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BundledMethodTestCase> {
                BundledMethodTestCase::create(builder, &self.inputs, &self.expected_outputs)
            }
        }

        /// Builder for serializing an instance of the [BundledMethodTestCase] type.
        ///
        /// Can be created using the [BundledMethodTestCase::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct BundledMethodTestCaseBuilder<State>(State);

        impl BundledMethodTestCaseBuilder<()> {
            /// Setter for the [`inputs` field](BundledMethodTestCase#structfield.inputs).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn inputs<T0>(self, value: T0) -> BundledMethodTestCaseBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Value>]>>,
            {
                BundledMethodTestCaseBuilder((value,))
            }

            /// Sets the [`inputs` field](BundledMethodTestCase#structfield.inputs) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn inputs_as_null(self) -> BundledMethodTestCaseBuilder<((),)> {
                self.inputs(())
            }
        }

        impl<T0> BundledMethodTestCaseBuilder<(T0,)> {
            /// Setter for the [`expected_outputs` field](BundledMethodTestCase#structfield.expected_outputs).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn expected_outputs<T1>(self, value: T1) -> BundledMethodTestCaseBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Value>]>>,
            {
                let (v0,) = self.0;
                BundledMethodTestCaseBuilder((v0, value))
            }

            /// Sets the [`expected_outputs` field](BundledMethodTestCase#structfield.expected_outputs) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn expected_outputs_as_null(self) -> BundledMethodTestCaseBuilder<(T0, ())> {
                self.expected_outputs(())
            }
        }

        impl<T0, T1> BundledMethodTestCaseBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [BundledMethodTestCase].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BundledMethodTestCase>
            where
                Self: ::planus::WriteAsOffset<BundledMethodTestCase>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Value>]>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Value>]>>,
            > ::planus::WriteAs<::planus::Offset<BundledMethodTestCase>>
            for BundledMethodTestCaseBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<BundledMethodTestCase>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BundledMethodTestCase> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Value>]>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Value>]>>,
            > ::planus::WriteAsOptional<::planus::Offset<BundledMethodTestCase>>
            for BundledMethodTestCaseBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<BundledMethodTestCase>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BundledMethodTestCase>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Value>]>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Value>]>>,
            > ::planus::WriteAsOffset<BundledMethodTestCase>
            for BundledMethodTestCaseBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BundledMethodTestCase> {
                let (v0, v1) = &self.0;
                BundledMethodTestCase::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [BundledMethodTestCase].
        #[derive(Copy, Clone)]
        pub struct BundledMethodTestCaseRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> BundledMethodTestCaseRef<'a> {
            /// Getter for the [`inputs` field](BundledMethodTestCase#structfield.inputs).
            #[inline]
            pub fn inputs(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<::planus::Vector<'a, ::planus::Result<self::ValueRef<'a>>>>,
            > {
                self.0.access(0, "BundledMethodTestCase", "inputs")
            }

            /// Getter for the [`expected_outputs` field](BundledMethodTestCase#structfield.expected_outputs).
            #[inline]
            pub fn expected_outputs(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<::planus::Vector<'a, ::planus::Result<self::ValueRef<'a>>>>,
            > {
                self.0
                    .access(1, "BundledMethodTestCase", "expected_outputs")
            }
        }

        impl<'a> ::core::fmt::Debug for BundledMethodTestCaseRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("BundledMethodTestCaseRef");
                if let ::core::option::Option::Some(field_inputs) = self.inputs().transpose() {
                    f.field("inputs", &field_inputs);
                }
                if let ::core::option::Option::Some(field_expected_outputs) =
                    self.expected_outputs().transpose()
                {
                    f.field("expected_outputs", &field_expected_outputs);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<BundledMethodTestCaseRef<'a>> for BundledMethodTestCase {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: BundledMethodTestCaseRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    inputs: if let ::core::option::Option::Some(inputs) = value.inputs()? {
                        ::core::option::Option::Some(inputs.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    expected_outputs: if let ::core::option::Option::Some(expected_outputs) =
                        value.expected_outputs()?
                    {
                        ::core::option::Option::Some(expected_outputs.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for BundledMethodTestCaseRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for BundledMethodTestCaseRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[BundledMethodTestCaseRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<BundledMethodTestCase>>
            for BundledMethodTestCase
        {
            type Value = ::planus::Offset<BundledMethodTestCase>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<BundledMethodTestCase>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for BundledMethodTestCaseRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[BundledMethodTestCaseRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `BundledMethodTestSuite` in the namespace `bundled_program_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `BundledMethodTestSuite` in the file `schema/bundled_program.fbs:44`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct BundledMethodTestSuite {
            /// The field `method_name` in the table `BundledMethodTestSuite`
            pub method_name: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `test_cases` in the table `BundledMethodTestSuite`
            pub test_cases:
                ::core::option::Option<::planus::alloc::vec::Vec<self::BundledMethodTestCase>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for BundledMethodTestSuite {
            fn default() -> Self {
                Self {
                    method_name: ::core::default::Default::default(),
                    test_cases: ::core::default::Default::default(),
                }
            }
        }

        impl BundledMethodTestSuite {
            /// Creates a [BundledMethodTestSuiteBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> BundledMethodTestSuiteBuilder<()> {
                BundledMethodTestSuiteBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_method_name: impl ::planus::WriteAsOptional<
                    ::planus::Offset<::core::primitive::str>,
                >,
                field_test_cases: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BundledMethodTestCase>]>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_method_name = field_method_name.prepare(builder);
                let prepared_test_cases = field_test_cases.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_method_name.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }
                if prepared_test_cases.is_some() {
                    table_writer.write_entry::<::planus::Offset<[::planus::Offset<self::BundledMethodTestCase>]>>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_method_name) =
                            prepared_method_name
                        {
                            object_writer.write::<_, _, 4>(&prepared_method_name);
                        }
                        if let ::core::option::Option::Some(prepared_test_cases) =
                            prepared_test_cases
                        {
                            object_writer.write::<_, _, 4>(&prepared_test_cases);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<BundledMethodTestSuite>> for BundledMethodTestSuite {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BundledMethodTestSuite> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<BundledMethodTestSuite>>
            for BundledMethodTestSuite
        {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BundledMethodTestSuite>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<BundledMethodTestSuite> for BundledMethodTestSuite {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BundledMethodTestSuite> {
                BundledMethodTestSuite::create(builder, &self.method_name, &self.test_cases)
            }
        }

        /// Builder for serializing an instance of the [BundledMethodTestSuite] type.
        ///
        /// Can be created using the [BundledMethodTestSuite::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct BundledMethodTestSuiteBuilder<State>(State);

        impl BundledMethodTestSuiteBuilder<()> {
            /// Setter for the [`method_name` field](BundledMethodTestSuite#structfield.method_name).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn method_name<T0>(self, value: T0) -> BundledMethodTestSuiteBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                BundledMethodTestSuiteBuilder((value,))
            }

            /// Sets the [`method_name` field](BundledMethodTestSuite#structfield.method_name) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn method_name_as_null(self) -> BundledMethodTestSuiteBuilder<((),)> {
                self.method_name(())
            }
        }

        impl<T0> BundledMethodTestSuiteBuilder<(T0,)> {
            /// Setter for the [`test_cases` field](BundledMethodTestSuite#structfield.test_cases).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn test_cases<T1>(self, value: T1) -> BundledMethodTestSuiteBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BundledMethodTestCase>]>,
                >,
            {
                let (v0,) = self.0;
                BundledMethodTestSuiteBuilder((v0, value))
            }

            /// Sets the [`test_cases` field](BundledMethodTestSuite#structfield.test_cases) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn test_cases_as_null(self) -> BundledMethodTestSuiteBuilder<(T0, ())> {
                self.test_cases(())
            }
        }

        impl<T0, T1> BundledMethodTestSuiteBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [BundledMethodTestSuite].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BundledMethodTestSuite>
            where
                Self: ::planus::WriteAsOffset<BundledMethodTestSuite>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BundledMethodTestCase>]>,
                >,
            > ::planus::WriteAs<::planus::Offset<BundledMethodTestSuite>>
            for BundledMethodTestSuiteBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<BundledMethodTestSuite>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BundledMethodTestSuite> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BundledMethodTestCase>]>,
                >,
            > ::planus::WriteAsOptional<::planus::Offset<BundledMethodTestSuite>>
            for BundledMethodTestSuiteBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<BundledMethodTestSuite>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BundledMethodTestSuite>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BundledMethodTestCase>]>,
                >,
            > ::planus::WriteAsOffset<BundledMethodTestSuite>
            for BundledMethodTestSuiteBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<BundledMethodTestSuite> {
                let (v0, v1) = &self.0;
                BundledMethodTestSuite::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [BundledMethodTestSuite].
        #[derive(Copy, Clone)]
        pub struct BundledMethodTestSuiteRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> BundledMethodTestSuiteRef<'a> {
            /// Getter for the [`method_name` field](BundledMethodTestSuite#structfield.method_name).
            #[inline]
            pub fn method_name(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "BundledMethodTestSuite", "method_name")
            }

            /// Getter for the [`test_cases` field](BundledMethodTestSuite#structfield.test_cases).
            #[inline]
            pub fn test_cases(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::BundledMethodTestCaseRef<'a>>>,
                >,
            > {
                self.0.access(1, "BundledMethodTestSuite", "test_cases")
            }
        }

        impl<'a> ::core::fmt::Debug for BundledMethodTestSuiteRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("BundledMethodTestSuiteRef");
                if let ::core::option::Option::Some(field_method_name) =
                    self.method_name().transpose()
                {
                    f.field("method_name", &field_method_name);
                }
                if let ::core::option::Option::Some(field_test_cases) =
                    self.test_cases().transpose()
                {
                    f.field("test_cases", &field_test_cases);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<BundledMethodTestSuiteRef<'a>> for BundledMethodTestSuite {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: BundledMethodTestSuiteRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    method_name: value.method_name()?.map(::core::convert::Into::into),
                    test_cases: if let ::core::option::Option::Some(test_cases) =
                        value.test_cases()?
                    {
                        ::core::option::Option::Some(test_cases.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for BundledMethodTestSuiteRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for BundledMethodTestSuiteRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[BundledMethodTestSuiteRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<BundledMethodTestSuite>>
            for BundledMethodTestSuite
        {
            type Value = ::planus::Offset<BundledMethodTestSuite>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<BundledMethodTestSuite>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for BundledMethodTestSuiteRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[BundledMethodTestSuiteRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `BundledProgram` in the namespace `bundled_program_flatbuffer`
        ///
        /// Generated from these locations:
        /// * Table `BundledProgram` in the file `schema/bundled_program.fbs:49`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct BundledProgram {
            /// The field `version` in the table `BundledProgram`
            pub version: u32,
            /// The field `method_test_suites` in the table `BundledProgram`
            pub method_test_suites:
                ::core::option::Option<::planus::alloc::vec::Vec<self::BundledMethodTestSuite>>,
            /// The field `program` in the table `BundledProgram`
            pub program: ::core::option::Option<::planus::alloc::vec::Vec<u8>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for BundledProgram {
            fn default() -> Self {
                Self {
                    version: 0,
                    method_test_suites: ::core::default::Default::default(),
                    program: ::core::default::Default::default(),
                }
            }
        }

        impl BundledProgram {
            /// Creates a [BundledProgramBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> BundledProgramBuilder<()> {
                BundledProgramBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_version: impl ::planus::WriteAsDefault<u32, u32>,
                field_method_test_suites: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BundledMethodTestSuite>]>,
                >,
                field_program: impl ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            ) -> ::planus::Offset<Self> {
                let prepared_version = field_version.prepare(builder, &0);
                let prepared_method_test_suites = field_method_test_suites.prepare(builder);
                let prepared_program = field_program.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<10> =
                    ::core::default::Default::default();
                if prepared_version.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_method_test_suites.is_some() {
                    table_writer.write_entry::<::planus::Offset<[::planus::Offset<self::BundledMethodTestSuite>]>>(1);
                }
                if prepared_program.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u8]>>(2);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_version) = prepared_version {
                            object_writer.write::<_, _, 4>(&prepared_version);
                        }
                        if let ::core::option::Option::Some(prepared_method_test_suites) =
                            prepared_method_test_suites
                        {
                            object_writer.write::<_, _, 4>(&prepared_method_test_suites);
                        }
                        if let ::core::option::Option::Some(prepared_program) = prepared_program {
                            object_writer.write::<_, _, 4>(&prepared_program);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<BundledProgram>> for BundledProgram {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<BundledProgram> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<BundledProgram>> for BundledProgram {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BundledProgram>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<BundledProgram> for BundledProgram {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<BundledProgram> {
                BundledProgram::create(
                    builder,
                    self.version,
                    &self.method_test_suites,
                    &self.program,
                )
            }
        }

        /// Builder for serializing an instance of the [BundledProgram] type.
        ///
        /// Can be created using the [BundledProgram::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct BundledProgramBuilder<State>(State);

        impl BundledProgramBuilder<()> {
            /// Setter for the [`version` field](BundledProgram#structfield.version).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn version<T0>(self, value: T0) -> BundledProgramBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                BundledProgramBuilder((value,))
            }

            /// Sets the [`version` field](BundledProgram#structfield.version) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn version_as_default(self) -> BundledProgramBuilder<(::planus::DefaultValue,)> {
                self.version(::planus::DefaultValue)
            }
        }

        impl<T0> BundledProgramBuilder<(T0,)> {
            /// Setter for the [`method_test_suites` field](BundledProgram#structfield.method_test_suites).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn method_test_suites<T1>(self, value: T1) -> BundledProgramBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BundledMethodTestSuite>]>,
                >,
            {
                let (v0,) = self.0;
                BundledProgramBuilder((v0, value))
            }

            /// Sets the [`method_test_suites` field](BundledProgram#structfield.method_test_suites) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn method_test_suites_as_null(self) -> BundledProgramBuilder<(T0, ())> {
                self.method_test_suites(())
            }
        }

        impl<T0, T1> BundledProgramBuilder<(T0, T1)> {
            /// Setter for the [`program` field](BundledProgram#structfield.program).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn program<T2>(self, value: T2) -> BundledProgramBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            {
                let (v0, v1) = self.0;
                BundledProgramBuilder((v0, v1, value))
            }

            /// Sets the [`program` field](BundledProgram#structfield.program) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn program_as_null(self) -> BundledProgramBuilder<(T0, T1, ())> {
                self.program(())
            }
        }

        impl<T0, T1, T2> BundledProgramBuilder<(T0, T1, T2)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [BundledProgram].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<BundledProgram>
            where
                Self: ::planus::WriteAsOffset<BundledProgram>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BundledMethodTestSuite>]>,
                >,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAs<::planus::Offset<BundledProgram>>
            for BundledProgramBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<BundledProgram>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<BundledProgram> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BundledMethodTestSuite>]>,
                >,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAsOptional<::planus::Offset<BundledProgram>>
            for BundledProgramBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<BundledProgram>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<BundledProgram>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::BundledMethodTestSuite>]>,
                >,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u8]>>,
            > ::planus::WriteAsOffset<BundledProgram> for BundledProgramBuilder<(T0, T1, T2)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<BundledProgram> {
                let (v0, v1, v2) = &self.0;
                BundledProgram::create(builder, v0, v1, v2)
            }
        }

        /// Reference to a deserialized [BundledProgram].
        #[derive(Copy, Clone)]
        pub struct BundledProgramRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> BundledProgramRef<'a> {
            /// Getter for the [`version` field](BundledProgram#structfield.version).
            #[inline]
            pub fn version(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(0, "BundledProgram", "version")?.unwrap_or(0),
                )
            }

            /// Getter for the [`method_test_suites` field](BundledProgram#structfield.method_test_suites).
            #[inline]
            pub fn method_test_suites(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::BundledMethodTestSuiteRef<'a>>>,
                >,
            > {
                self.0.access(1, "BundledProgram", "method_test_suites")
            }

            /// Getter for the [`program` field](BundledProgram#structfield.program).
            #[inline]
            pub fn program(&self) -> ::planus::Result<::core::option::Option<&'a [u8]>> {
                self.0.access(2, "BundledProgram", "program")
            }
        }

        impl<'a> ::core::fmt::Debug for BundledProgramRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("BundledProgramRef");
                f.field("version", &self.version());
                if let ::core::option::Option::Some(field_method_test_suites) =
                    self.method_test_suites().transpose()
                {
                    f.field("method_test_suites", &field_method_test_suites);
                }
                if let ::core::option::Option::Some(field_program) = self.program().transpose() {
                    f.field("program", &field_program);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<BundledProgramRef<'a>> for BundledProgram {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: BundledProgramRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    version: ::core::convert::TryInto::try_into(value.version()?)?,
                    method_test_suites: if let ::core::option::Option::Some(method_test_suites) =
                        value.method_test_suites()?
                    {
                        ::core::option::Option::Some(method_test_suites.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    program: value.program()?.map(|v| v.to_vec()),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for BundledProgramRef<'a> {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                ::core::result::Result::Ok(Self(::planus::table_reader::Table::from_buffer(
                    buffer, offset,
                )?))
            }
        }

        impl<'a> ::planus::VectorReadInner<'a> for BundledProgramRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[BundledProgramRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<BundledProgram>> for BundledProgram {
            type Value = ::planus::Offset<BundledProgram>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<BundledProgram>],
                bytes: *mut ::core::mem::MaybeUninit<u8>,
                buffer_position: u32,
            ) {
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 4];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (Self::STRIDE * i) as u32,
                    );
                }
            }
        }

        impl<'a> ::planus::ReadAsRoot<'a> for BundledProgramRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[BundledProgramRef]", "read_as_root", 0)
                })
            }
        }
    }
}
