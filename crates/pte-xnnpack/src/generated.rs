pub use root::*;

const _: () = ::planus::check_version_compatibility("planus-1.3.0");

/// The root namespace
///
/// Generated from these locations:
/// * File `schema/xnnpack.fbs`
#[no_implicit_prelude]
#[allow(clippy::needless_lifetimes)]
mod root {
    /// The namespace `fb_xnnpack`
    ///
    /// Generated from these locations:
    /// * File `schema/xnnpack.fbs`
    pub mod fb_xnnpack {
        /// The enum `XNNDatatype` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Enum `XNNDatatype` in the file `schema/xnnpack.fbs:16`
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
        #[repr(i16)]
        pub enum XnnDatatype {
            /// The variant `xnn_datatype_invalid` in the enum `XNNDatatype`
            XnnDatatypeInvalid = 0,

            /// The variant `xnn_datatype_fp32` in the enum `XNNDatatype`
            XnnDatatypeFp32 = 1,

            /// The variant `xnn_datatype_fp16` in the enum `XNNDatatype`
            XnnDatatypeFp16 = 2,

            /// The variant `xnn_datatype_qint8` in the enum `XNNDatatype`
            XnnDatatypeQint8 = 3,

            /// The variant `xnn_datatype_quint8` in the enum `XNNDatatype`
            XnnDatatypeQuint8 = 4,

            /// The variant `xnn_datatype_qint32` in the enum `XNNDatatype`
            XnnDatatypeQint32 = 5,

            /// The variant `xnn_datatype_qcint8` in the enum `XNNDatatype`
            XnnDatatypeQcint8 = 6,

            /// The variant `xnn_datatype_qcint32` in the enum `XNNDatatype`
            XnnDatatypeQcint32 = 7,

            /// The variant `xnn_datatype_qcint4` in the enum `XNNDatatype`
            XnnDatatypeQcint4 = 8,

            /// The variant `xnn_datatype_qdint8` in the enum `XNNDatatype`
            XnnDatatypeQdint8 = 9,

            /// The variant `xnn_datatype_qbint4` in the enum `XNNDatatype`
            XnnDatatypeQbint4 = 10,

            /// The variant `xnn_datatype_qpint8` in the enum `XNNDatatype`
            XnnDatatypeQpint8 = 11,

            /// The variant `xnn_datatype_int32` in the enum `XNNDatatype`
            XnnDatatypeInt32 = 12,

            /// The variant `xnn_datatype_pfp32` in the enum `XNNDatatype`
            XnnDatatypePfp32 = 13,

            /// The variant `xnn_datatype_bf16` in the enum `XNNDatatype`
            XnnDatatypeBf16 = 14,
        }

        impl XnnDatatype {
            /// Array containing all valid variants of XnnDatatype
            pub const ENUM_VALUES: [Self; 15] = [
                Self::XnnDatatypeInvalid,
                Self::XnnDatatypeFp32,
                Self::XnnDatatypeFp16,
                Self::XnnDatatypeQint8,
                Self::XnnDatatypeQuint8,
                Self::XnnDatatypeQint32,
                Self::XnnDatatypeQcint8,
                Self::XnnDatatypeQcint32,
                Self::XnnDatatypeQcint4,
                Self::XnnDatatypeQdint8,
                Self::XnnDatatypeQbint4,
                Self::XnnDatatypeQpint8,
                Self::XnnDatatypeInt32,
                Self::XnnDatatypePfp32,
                Self::XnnDatatypeBf16,
            ];
        }

        impl ::core::convert::TryFrom<i16> for XnnDatatype {
            type Error = ::planus::errors::UnknownEnumTagKind;
            #[inline]
            fn try_from(
                value: i16,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTagKind> {
                #[allow(clippy::match_single_binding)]
                match value {
                    0 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeInvalid),
                    1 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeFp32),
                    2 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeFp16),
                    3 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeQint8),
                    4 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeQuint8),
                    5 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeQint32),
                    6 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeQcint8),
                    7 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeQcint32),
                    8 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeQcint4),
                    9 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeQdint8),
                    10 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeQbint4),
                    11 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeQpint8),
                    12 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeInt32),
                    13 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypePfp32),
                    14 => ::core::result::Result::Ok(XnnDatatype::XnnDatatypeBf16),

                    _ => ::core::result::Result::Err(::planus::errors::UnknownEnumTagKind {
                        tag: value as i128,
                    }),
                }
            }
        }

        impl ::core::convert::From<XnnDatatype> for i16 {
            #[inline]
            fn from(value: XnnDatatype) -> Self {
                value as i16
            }
        }

        /// # Safety
        /// The Planus compiler correctly calculates `ALIGNMENT` and `SIZE`.
        unsafe impl ::planus::Primitive for XnnDatatype {
            const ALIGNMENT: usize = 2;
            const SIZE: usize = 2;
        }

        impl ::planus::WriteAsPrimitive<XnnDatatype> for XnnDatatype {
            #[inline]
            fn write<const N: usize>(&self, cursor: ::planus::Cursor<'_, N>, buffer_position: u32) {
                (*self as i16).write(cursor, buffer_position);
            }
        }

        impl ::planus::WriteAs<XnnDatatype> for XnnDatatype {
            type Prepared = Self;

            #[inline]
            fn prepare(&self, _builder: &mut ::planus::Builder) -> XnnDatatype {
                *self
            }
        }

        impl ::planus::WriteAsDefault<XnnDatatype, XnnDatatype> for XnnDatatype {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
                default: &XnnDatatype,
            ) -> ::core::option::Option<XnnDatatype> {
                if self == default {
                    ::core::option::Option::None
                } else {
                    ::core::option::Option::Some(*self)
                }
            }
        }

        impl ::planus::WriteAsOptional<XnnDatatype> for XnnDatatype {
            type Prepared = Self;

            #[inline]
            fn prepare(
                &self,
                _builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<XnnDatatype> {
                ::core::option::Option::Some(*self)
            }
        }

        impl<'buf> ::planus::TableRead<'buf> for XnnDatatype {
            #[inline]
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                let n: i16 = ::planus::TableRead::from_buffer(buffer, offset)?;
                ::core::result::Result::Ok(::core::convert::TryInto::try_into(n)?)
            }
        }

        impl<'buf> ::planus::VectorReadInner<'buf> for XnnDatatype {
            type Error = ::planus::errors::UnknownEnumTag;
            const STRIDE: usize = 2;
            #[inline]
            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'buf>,
                offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::UnknownEnumTag> {
                let value = unsafe { <i16 as ::planus::VectorRead>::from_buffer(buffer, offset) };
                let value: ::core::result::Result<Self, _> =
                    ::core::convert::TryInto::try_into(value);
                value.map_err(|error_kind| {
                    error_kind.with_error_location(
                        "XnnDatatype",
                        "VectorRead::from_buffer",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<XnnDatatype> for XnnDatatype {
            const STRIDE: usize = 2;

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
                let bytes = bytes as *mut [::core::mem::MaybeUninit<u8>; 2];
                for (i, v) in ::core::iter::Iterator::enumerate(values.iter()) {
                    ::planus::WriteAsPrimitive::write(
                        v,
                        ::planus::Cursor::new(unsafe { &mut *bytes.add(i) }),
                        buffer_position - (2 * i) as u32,
                    );
                }
            }
        }

        /// The union `XNNQuantParams` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Union `XNNQuantParams` in the file `schema/xnnpack.fbs:44`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub enum XnnQuantParams {
            /// The variant of type `PerChannelQuant` in the union `XNNQuantParams`
            PerChannelQuant(::planus::alloc::boxed::Box<self::PerChannelQuant>),

            /// The variant of type `PerTensorQuant` in the union `XNNQuantParams`
            PerTensorQuant(::planus::alloc::boxed::Box<self::PerTensorQuant>),

            /// The variant of type `PerTokenDynamicQuant` in the union `XNNQuantParams`
            PerTokenDynamicQuant(::planus::alloc::boxed::Box<self::PerTokenDynamicQuant>),

            /// The variant of type `PerChannelGroupQuant` in the union `XNNQuantParams`
            PerChannelGroupQuant(::planus::alloc::boxed::Box<self::PerChannelGroupQuant>),
        }

        impl XnnQuantParams {
            /// Creates a [XnnQuantParamsBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnQuantParamsBuilder<::planus::Uninitialized> {
                XnnQuantParamsBuilder(::planus::Uninitialized)
            }

            #[inline]
            pub fn create_per_channel_quant(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::PerChannelQuant>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(1, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_per_tensor_quant(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::PerTensorQuant>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(2, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_per_token_dynamic_quant(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::PerTokenDynamicQuant>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(3, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_per_channel_group_quant(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::PerChannelGroupQuant>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(4, value.prepare(builder).downcast())
            }
        }

        impl ::planus::WriteAsUnion<XnnQuantParams> for XnnQuantParams {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::UnionOffset<Self> {
                match self {
                    Self::PerChannelQuant(value) => Self::create_per_channel_quant(builder, value),
                    Self::PerTensorQuant(value) => Self::create_per_tensor_quant(builder, value),
                    Self::PerTokenDynamicQuant(value) => {
                        Self::create_per_token_dynamic_quant(builder, value)
                    }
                    Self::PerChannelGroupQuant(value) => {
                        Self::create_per_channel_group_quant(builder, value)
                    }
                }
            }
        }

        impl ::planus::WriteAsOptionalUnion<XnnQuantParams> for XnnQuantParams {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<Self>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Builder for serializing an instance of the [XnnQuantParams] type.
        ///
        /// Can be created using the [XnnQuantParams::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnQuantParamsBuilder<T>(T);

        impl XnnQuantParamsBuilder<::planus::Uninitialized> {
            /// Creates an instance of the [`PerChannelQuant` variant](XnnQuantParams#variant.PerChannelQuant).
            #[inline]
            pub fn per_channel_quant<T>(
                self,
                value: T,
            ) -> XnnQuantParamsBuilder<::planus::Initialized<1, T>>
            where
                T: ::planus::WriteAsOffset<self::PerChannelQuant>,
            {
                XnnQuantParamsBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`PerTensorQuant` variant](XnnQuantParams#variant.PerTensorQuant).
            #[inline]
            pub fn per_tensor_quant<T>(
                self,
                value: T,
            ) -> XnnQuantParamsBuilder<::planus::Initialized<2, T>>
            where
                T: ::planus::WriteAsOffset<self::PerTensorQuant>,
            {
                XnnQuantParamsBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`PerTokenDynamicQuant` variant](XnnQuantParams#variant.PerTokenDynamicQuant).
            #[inline]
            pub fn per_token_dynamic_quant<T>(
                self,
                value: T,
            ) -> XnnQuantParamsBuilder<::planus::Initialized<3, T>>
            where
                T: ::planus::WriteAsOffset<self::PerTokenDynamicQuant>,
            {
                XnnQuantParamsBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`PerChannelGroupQuant` variant](XnnQuantParams#variant.PerChannelGroupQuant).
            #[inline]
            pub fn per_channel_group_quant<T>(
                self,
                value: T,
            ) -> XnnQuantParamsBuilder<::planus::Initialized<4, T>>
            where
                T: ::planus::WriteAsOffset<self::PerChannelGroupQuant>,
            {
                XnnQuantParamsBuilder(::planus::Initialized(value))
            }
        }

        impl<const N: u8, T> XnnQuantParamsBuilder<::planus::Initialized<N, T>> {
            /// Finish writing the builder to get an [UnionOffset](::planus::UnionOffset) to a serialized [XnnQuantParams].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XnnQuantParams>
            where
                Self: ::planus::WriteAsUnion<XnnQuantParams>,
            {
                ::planus::WriteAsUnion::prepare(&self, builder)
            }
        }

        impl<T> ::planus::WriteAsUnion<XnnQuantParams>
            for XnnQuantParamsBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::PerChannelQuant>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XnnQuantParams> {
                ::planus::UnionOffset::new(1, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XnnQuantParams>
            for XnnQuantParamsBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::PerChannelQuant>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XnnQuantParams>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XnnQuantParams>
            for XnnQuantParamsBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::PerTensorQuant>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XnnQuantParams> {
                ::planus::UnionOffset::new(2, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XnnQuantParams>
            for XnnQuantParamsBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::PerTensorQuant>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XnnQuantParams>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XnnQuantParams>
            for XnnQuantParamsBuilder<::planus::Initialized<3, T>>
        where
            T: ::planus::WriteAsOffset<self::PerTokenDynamicQuant>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XnnQuantParams> {
                ::planus::UnionOffset::new(3, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XnnQuantParams>
            for XnnQuantParamsBuilder<::planus::Initialized<3, T>>
        where
            T: ::planus::WriteAsOffset<self::PerTokenDynamicQuant>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XnnQuantParams>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XnnQuantParams>
            for XnnQuantParamsBuilder<::planus::Initialized<4, T>>
        where
            T: ::planus::WriteAsOffset<self::PerChannelGroupQuant>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XnnQuantParams> {
                ::planus::UnionOffset::new(4, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XnnQuantParams>
            for XnnQuantParamsBuilder<::planus::Initialized<4, T>>
        where
            T: ::planus::WriteAsOffset<self::PerChannelGroupQuant>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XnnQuantParams>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Reference to a deserialized [XnnQuantParams].
        #[derive(Copy, Clone, Debug)]
        pub enum XnnQuantParamsRef<'a> {
            PerChannelQuant(self::PerChannelQuantRef<'a>),
            PerTensorQuant(self::PerTensorQuantRef<'a>),
            PerTokenDynamicQuant(self::PerTokenDynamicQuantRef<'a>),
            PerChannelGroupQuant(self::PerChannelGroupQuantRef<'a>),
        }

        impl<'a> ::core::convert::TryFrom<XnnQuantParamsRef<'a>> for XnnQuantParams {
            type Error = ::planus::Error;

            fn try_from(value: XnnQuantParamsRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(match value {
                    XnnQuantParamsRef::PerChannelQuant(value) => {
                        Self::PerChannelQuant(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XnnQuantParamsRef::PerTensorQuant(value) => {
                        Self::PerTensorQuant(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XnnQuantParamsRef::PerTokenDynamicQuant(value) => {
                        Self::PerTokenDynamicQuant(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XnnQuantParamsRef::PerChannelGroupQuant(value) => {
                        Self::PerChannelGroupQuant(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }
                })
            }
        }

        impl<'a> ::planus::TableReadUnion<'a> for XnnQuantParamsRef<'a> {
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                tag: u8,
                field_offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                match tag {
                    1 => ::core::result::Result::Ok(Self::PerChannelQuant(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    2 => ::core::result::Result::Ok(Self::PerTensorQuant(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    3 => ::core::result::Result::Ok(Self::PerTokenDynamicQuant(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    4 => ::core::result::Result::Ok(Self::PerChannelGroupQuant(
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

        impl<'a> ::planus::VectorReadUnion<'a> for XnnQuantParamsRef<'a> {
            const VECTOR_NAME: &'static str = "[XnnQuantParamsRef]";
        }

        /// The table `Buffer` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `Buffer` in the file `schema/xnnpack.fbs:52`
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

        /// The table `PerChannelQuant` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `PerChannelQuant` in the file `schema/xnnpack.fbs:59`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct PerChannelQuant {
            /// The field `scale` in the table `PerChannelQuant`
            pub scale: ::core::option::Option<::planus::alloc::vec::Vec<f32>>,
            /// The field `channel_dim` in the table `PerChannelQuant`
            pub channel_dim: i32,
            /// The field `scale_buffer_idx` in the table `PerChannelQuant`
            pub scale_buffer_idx: u32,
            /// The field `num_scales` in the table `PerChannelQuant`
            pub num_scales: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for PerChannelQuant {
            fn default() -> Self {
                Self {
                    scale: ::core::default::Default::default(),
                    channel_dim: 0,
                    scale_buffer_idx: 0,
                    num_scales: 0,
                }
            }
        }

        impl PerChannelQuant {
            /// Creates a [PerChannelQuantBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> PerChannelQuantBuilder<()> {
                PerChannelQuantBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_scale: impl ::planus::WriteAsOptional<::planus::Offset<[f32]>>,
                field_channel_dim: impl ::planus::WriteAsDefault<i32, i32>,
                field_scale_buffer_idx: impl ::planus::WriteAsDefault<u32, u32>,
                field_num_scales: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_scale = field_scale.prepare(builder);
                let prepared_channel_dim = field_channel_dim.prepare(builder, &0);
                let prepared_scale_buffer_idx = field_scale_buffer_idx.prepare(builder, &0);
                let prepared_num_scales = field_num_scales.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<12> =
                    ::core::default::Default::default();
                if prepared_scale.is_some() {
                    table_writer.write_entry::<::planus::Offset<[f32]>>(0);
                }
                if prepared_channel_dim.is_some() {
                    table_writer.write_entry::<i32>(1);
                }
                if prepared_scale_buffer_idx.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_num_scales.is_some() {
                    table_writer.write_entry::<u32>(3);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_scale) = prepared_scale {
                            object_writer.write::<_, _, 4>(&prepared_scale);
                        }
                        if let ::core::option::Option::Some(prepared_channel_dim) =
                            prepared_channel_dim
                        {
                            object_writer.write::<_, _, 4>(&prepared_channel_dim);
                        }
                        if let ::core::option::Option::Some(prepared_scale_buffer_idx) =
                            prepared_scale_buffer_idx
                        {
                            object_writer.write::<_, _, 4>(&prepared_scale_buffer_idx);
                        }
                        if let ::core::option::Option::Some(prepared_num_scales) =
                            prepared_num_scales
                        {
                            object_writer.write::<_, _, 4>(&prepared_num_scales);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<PerChannelQuant>> for PerChannelQuant {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerChannelQuant> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<PerChannelQuant>> for PerChannelQuant {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<PerChannelQuant>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<PerChannelQuant> for PerChannelQuant {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerChannelQuant> {
                PerChannelQuant::create(
                    builder,
                    &self.scale,
                    self.channel_dim,
                    self.scale_buffer_idx,
                    self.num_scales,
                )
            }
        }

        /// Builder for serializing an instance of the [PerChannelQuant] type.
        ///
        /// Can be created using the [PerChannelQuant::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct PerChannelQuantBuilder<State>(State);

        impl PerChannelQuantBuilder<()> {
            /// Setter for the [`scale` field](PerChannelQuant#structfield.scale).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale<T0>(self, value: T0) -> PerChannelQuantBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[f32]>>,
            {
                PerChannelQuantBuilder((value,))
            }

            /// Sets the [`scale` field](PerChannelQuant#structfield.scale) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale_as_null(self) -> PerChannelQuantBuilder<((),)> {
                self.scale(())
            }
        }

        impl<T0> PerChannelQuantBuilder<(T0,)> {
            /// Setter for the [`channel_dim` field](PerChannelQuant#structfield.channel_dim).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn channel_dim<T1>(self, value: T1) -> PerChannelQuantBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<i32, i32>,
            {
                let (v0,) = self.0;
                PerChannelQuantBuilder((v0, value))
            }

            /// Sets the [`channel_dim` field](PerChannelQuant#structfield.channel_dim) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn channel_dim_as_default(
                self,
            ) -> PerChannelQuantBuilder<(T0, ::planus::DefaultValue)> {
                self.channel_dim(::planus::DefaultValue)
            }
        }

        impl<T0, T1> PerChannelQuantBuilder<(T0, T1)> {
            /// Setter for the [`scale_buffer_idx` field](PerChannelQuant#structfield.scale_buffer_idx).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale_buffer_idx<T2>(self, value: T2) -> PerChannelQuantBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                PerChannelQuantBuilder((v0, v1, value))
            }

            /// Sets the [`scale_buffer_idx` field](PerChannelQuant#structfield.scale_buffer_idx) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale_buffer_idx_as_default(
                self,
            ) -> PerChannelQuantBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.scale_buffer_idx(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> PerChannelQuantBuilder<(T0, T1, T2)> {
            /// Setter for the [`num_scales` field](PerChannelQuant#structfield.num_scales).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_scales<T3>(self, value: T3) -> PerChannelQuantBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                PerChannelQuantBuilder((v0, v1, v2, value))
            }

            /// Sets the [`num_scales` field](PerChannelQuant#structfield.num_scales) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_scales_as_default(
                self,
            ) -> PerChannelQuantBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.num_scales(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> PerChannelQuantBuilder<(T0, T1, T2, T3)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [PerChannelQuant].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerChannelQuant>
            where
                Self: ::planus::WriteAsOffset<PerChannelQuant>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[f32]>>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<PerChannelQuant>>
            for PerChannelQuantBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<PerChannelQuant>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerChannelQuant> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[f32]>>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<PerChannelQuant>>
            for PerChannelQuantBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<PerChannelQuant>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<PerChannelQuant>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[f32]>>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<PerChannelQuant>
            for PerChannelQuantBuilder<(T0, T1, T2, T3)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerChannelQuant> {
                let (v0, v1, v2, v3) = &self.0;
                PerChannelQuant::create(builder, v0, v1, v2, v3)
            }
        }

        /// Reference to a deserialized [PerChannelQuant].
        #[derive(Copy, Clone)]
        pub struct PerChannelQuantRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> PerChannelQuantRef<'a> {
            /// Getter for the [`scale` field](PerChannelQuant#structfield.scale).
            #[inline]
            pub fn scale(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, f32>>> {
                self.0.access(0, "PerChannelQuant", "scale")
            }

            /// Getter for the [`channel_dim` field](PerChannelQuant#structfield.channel_dim).
            #[inline]
            pub fn channel_dim(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "PerChannelQuant", "channel_dim")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`scale_buffer_idx` field](PerChannelQuant#structfield.scale_buffer_idx).
            #[inline]
            pub fn scale_buffer_idx(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "PerChannelQuant", "scale_buffer_idx")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`num_scales` field](PerChannelQuant#structfield.num_scales).
            #[inline]
            pub fn num_scales(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "PerChannelQuant", "num_scales")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for PerChannelQuantRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("PerChannelQuantRef");
                if let ::core::option::Option::Some(field_scale) = self.scale().transpose() {
                    f.field("scale", &field_scale);
                }
                f.field("channel_dim", &self.channel_dim());
                f.field("scale_buffer_idx", &self.scale_buffer_idx());
                f.field("num_scales", &self.num_scales());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<PerChannelQuantRef<'a>> for PerChannelQuant {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: PerChannelQuantRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    scale: if let ::core::option::Option::Some(scale) = value.scale()? {
                        ::core::option::Option::Some(scale.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    channel_dim: ::core::convert::TryInto::try_into(value.channel_dim()?)?,
                    scale_buffer_idx: ::core::convert::TryInto::try_into(
                        value.scale_buffer_idx()?,
                    )?,
                    num_scales: ::core::convert::TryInto::try_into(value.num_scales()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for PerChannelQuantRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for PerChannelQuantRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[PerChannelQuantRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<PerChannelQuant>> for PerChannelQuant {
            type Value = ::planus::Offset<PerChannelQuant>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<PerChannelQuant>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for PerChannelQuantRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[PerChannelQuantRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `PerTokenDynamicQuant` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `PerTokenDynamicQuant` in the file `schema/xnnpack.fbs:68`
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
        pub struct PerTokenDynamicQuant {
            /// The field `num_nonbatch_dims` in the table `PerTokenDynamicQuant`
            pub num_nonbatch_dims: i32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for PerTokenDynamicQuant {
            fn default() -> Self {
                Self {
                    num_nonbatch_dims: 0,
                }
            }
        }

        impl PerTokenDynamicQuant {
            /// Creates a [PerTokenDynamicQuantBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> PerTokenDynamicQuantBuilder<()> {
                PerTokenDynamicQuantBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_num_nonbatch_dims: impl ::planus::WriteAsDefault<i32, i32>,
            ) -> ::planus::Offset<Self> {
                let prepared_num_nonbatch_dims = field_num_nonbatch_dims.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<6> =
                    ::core::default::Default::default();
                if prepared_num_nonbatch_dims.is_some() {
                    table_writer.write_entry::<i32>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_num_nonbatch_dims) =
                            prepared_num_nonbatch_dims
                        {
                            object_writer.write::<_, _, 4>(&prepared_num_nonbatch_dims);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<PerTokenDynamicQuant>> for PerTokenDynamicQuant {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerTokenDynamicQuant> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<PerTokenDynamicQuant>> for PerTokenDynamicQuant {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<PerTokenDynamicQuant>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<PerTokenDynamicQuant> for PerTokenDynamicQuant {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerTokenDynamicQuant> {
                PerTokenDynamicQuant::create(builder, self.num_nonbatch_dims)
            }
        }

        /// Builder for serializing an instance of the [PerTokenDynamicQuant] type.
        ///
        /// Can be created using the [PerTokenDynamicQuant::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct PerTokenDynamicQuantBuilder<State>(State);

        impl PerTokenDynamicQuantBuilder<()> {
            /// Setter for the [`num_nonbatch_dims` field](PerTokenDynamicQuant#structfield.num_nonbatch_dims).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_nonbatch_dims<T0>(self, value: T0) -> PerTokenDynamicQuantBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<i32, i32>,
            {
                PerTokenDynamicQuantBuilder((value,))
            }

            /// Sets the [`num_nonbatch_dims` field](PerTokenDynamicQuant#structfield.num_nonbatch_dims) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_nonbatch_dims_as_default(
                self,
            ) -> PerTokenDynamicQuantBuilder<(::planus::DefaultValue,)> {
                self.num_nonbatch_dims(::planus::DefaultValue)
            }
        }

        impl<T0> PerTokenDynamicQuantBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [PerTokenDynamicQuant].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerTokenDynamicQuant>
            where
                Self: ::planus::WriteAsOffset<PerTokenDynamicQuant>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAs<::planus::Offset<PerTokenDynamicQuant>>
            for PerTokenDynamicQuantBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<PerTokenDynamicQuant>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerTokenDynamicQuant> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAsOptional<::planus::Offset<PerTokenDynamicQuant>>
            for PerTokenDynamicQuantBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<PerTokenDynamicQuant>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<PerTokenDynamicQuant>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<i32, i32>> ::planus::WriteAsOffset<PerTokenDynamicQuant>
            for PerTokenDynamicQuantBuilder<(T0,)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerTokenDynamicQuant> {
                let (v0,) = &self.0;
                PerTokenDynamicQuant::create(builder, v0)
            }
        }

        /// Reference to a deserialized [PerTokenDynamicQuant].
        #[derive(Copy, Clone)]
        pub struct PerTokenDynamicQuantRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> PerTokenDynamicQuantRef<'a> {
            /// Getter for the [`num_nonbatch_dims` field](PerTokenDynamicQuant#structfield.num_nonbatch_dims).
            #[inline]
            pub fn num_nonbatch_dims(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "PerTokenDynamicQuant", "num_nonbatch_dims")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for PerTokenDynamicQuantRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("PerTokenDynamicQuantRef");
                f.field("num_nonbatch_dims", &self.num_nonbatch_dims());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<PerTokenDynamicQuantRef<'a>> for PerTokenDynamicQuant {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: PerTokenDynamicQuantRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    num_nonbatch_dims: ::core::convert::TryInto::try_into(
                        value.num_nonbatch_dims()?,
                    )?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for PerTokenDynamicQuantRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for PerTokenDynamicQuantRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[PerTokenDynamicQuantRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<PerTokenDynamicQuant>> for PerTokenDynamicQuant {
            type Value = ::planus::Offset<PerTokenDynamicQuant>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<PerTokenDynamicQuant>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for PerTokenDynamicQuantRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[PerTokenDynamicQuantRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `PerTensorQuant` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `PerTensorQuant` in the file `schema/xnnpack.fbs:72`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct PerTensorQuant {
            /// The field `scale` in the table `PerTensorQuant`
            pub scale: f32,
            /// The field `zero_point` in the table `PerTensorQuant`
            pub zero_point: i32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for PerTensorQuant {
            fn default() -> Self {
                Self {
                    scale: 0.0,
                    zero_point: 0,
                }
            }
        }

        impl PerTensorQuant {
            /// Creates a [PerTensorQuantBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> PerTensorQuantBuilder<()> {
                PerTensorQuantBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_scale: impl ::planus::WriteAsDefault<f32, f32>,
                field_zero_point: impl ::planus::WriteAsDefault<i32, i32>,
            ) -> ::planus::Offset<Self> {
                let prepared_scale = field_scale.prepare(builder, &0.0);
                let prepared_zero_point = field_zero_point.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_scale.is_some() {
                    table_writer.write_entry::<f32>(0);
                }
                if prepared_zero_point.is_some() {
                    table_writer.write_entry::<i32>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_scale) = prepared_scale {
                            object_writer.write::<_, _, 4>(&prepared_scale);
                        }
                        if let ::core::option::Option::Some(prepared_zero_point) =
                            prepared_zero_point
                        {
                            object_writer.write::<_, _, 4>(&prepared_zero_point);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<PerTensorQuant>> for PerTensorQuant {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<PerTensorQuant> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<PerTensorQuant>> for PerTensorQuant {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<PerTensorQuant>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<PerTensorQuant> for PerTensorQuant {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<PerTensorQuant> {
                PerTensorQuant::create(builder, self.scale, self.zero_point)
            }
        }

        /// Builder for serializing an instance of the [PerTensorQuant] type.
        ///
        /// Can be created using the [PerTensorQuant::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct PerTensorQuantBuilder<State>(State);

        impl PerTensorQuantBuilder<()> {
            /// Setter for the [`scale` field](PerTensorQuant#structfield.scale).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale<T0>(self, value: T0) -> PerTensorQuantBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<f32, f32>,
            {
                PerTensorQuantBuilder((value,))
            }

            /// Sets the [`scale` field](PerTensorQuant#structfield.scale) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale_as_default(self) -> PerTensorQuantBuilder<(::planus::DefaultValue,)> {
                self.scale(::planus::DefaultValue)
            }
        }

        impl<T0> PerTensorQuantBuilder<(T0,)> {
            /// Setter for the [`zero_point` field](PerTensorQuant#structfield.zero_point).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn zero_point<T1>(self, value: T1) -> PerTensorQuantBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<i32, i32>,
            {
                let (v0,) = self.0;
                PerTensorQuantBuilder((v0, value))
            }

            /// Sets the [`zero_point` field](PerTensorQuant#structfield.zero_point) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn zero_point_as_default(
                self,
            ) -> PerTensorQuantBuilder<(T0, ::planus::DefaultValue)> {
                self.zero_point(::planus::DefaultValue)
            }
        }

        impl<T0, T1> PerTensorQuantBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [PerTensorQuant].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<PerTensorQuant>
            where
                Self: ::planus::WriteAsOffset<PerTensorQuant>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<f32, f32>, T1: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAs<::planus::Offset<PerTensorQuant>>
            for PerTensorQuantBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<PerTensorQuant>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<PerTensorQuant> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<f32, f32>, T1: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAsOptional<::planus::Offset<PerTensorQuant>>
            for PerTensorQuantBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<PerTensorQuant>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<PerTensorQuant>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<f32, f32>, T1: ::planus::WriteAsDefault<i32, i32>>
            ::planus::WriteAsOffset<PerTensorQuant> for PerTensorQuantBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<PerTensorQuant> {
                let (v0, v1) = &self.0;
                PerTensorQuant::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [PerTensorQuant].
        #[derive(Copy, Clone)]
        pub struct PerTensorQuantRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> PerTensorQuantRef<'a> {
            /// Getter for the [`scale` field](PerTensorQuant#structfield.scale).
            #[inline]
            pub fn scale(&self) -> ::planus::Result<f32> {
                ::core::result::Result::Ok(
                    self.0.access(0, "PerTensorQuant", "scale")?.unwrap_or(0.0),
                )
            }

            /// Getter for the [`zero_point` field](PerTensorQuant#structfield.zero_point).
            #[inline]
            pub fn zero_point(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "PerTensorQuant", "zero_point")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for PerTensorQuantRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("PerTensorQuantRef");
                f.field("scale", &self.scale());
                f.field("zero_point", &self.zero_point());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<PerTensorQuantRef<'a>> for PerTensorQuant {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: PerTensorQuantRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    scale: ::core::convert::TryInto::try_into(value.scale()?)?,
                    zero_point: ::core::convert::TryInto::try_into(value.zero_point()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for PerTensorQuantRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for PerTensorQuantRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[PerTensorQuantRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<PerTensorQuant>> for PerTensorQuant {
            type Value = ::planus::Offset<PerTensorQuant>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<PerTensorQuant>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for PerTensorQuantRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[PerTensorQuantRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `PerChannelGroupQuant` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `PerChannelGroupQuant` in the file `schema/xnnpack.fbs:79`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct PerChannelGroupQuant {
            /// The field `scale` in the table `PerChannelGroupQuant`
            pub scale: ::core::option::Option<::planus::alloc::vec::Vec<f32>>,
            /// The field `channel_dim` in the table `PerChannelGroupQuant`
            pub channel_dim: i32,
            /// The field `group_size` in the table `PerChannelGroupQuant`
            pub group_size: i32,
            /// The field `scale_buffer_idx` in the table `PerChannelGroupQuant`
            pub scale_buffer_idx: u32,
            /// The field `num_scales` in the table `PerChannelGroupQuant`
            pub num_scales: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for PerChannelGroupQuant {
            fn default() -> Self {
                Self {
                    scale: ::core::default::Default::default(),
                    channel_dim: 0,
                    group_size: 0,
                    scale_buffer_idx: 0,
                    num_scales: 0,
                }
            }
        }

        impl PerChannelGroupQuant {
            /// Creates a [PerChannelGroupQuantBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> PerChannelGroupQuantBuilder<()> {
                PerChannelGroupQuantBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_scale: impl ::planus::WriteAsOptional<::planus::Offset<[f32]>>,
                field_channel_dim: impl ::planus::WriteAsDefault<i32, i32>,
                field_group_size: impl ::planus::WriteAsDefault<i32, i32>,
                field_scale_buffer_idx: impl ::planus::WriteAsDefault<u32, u32>,
                field_num_scales: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_scale = field_scale.prepare(builder);
                let prepared_channel_dim = field_channel_dim.prepare(builder, &0);
                let prepared_group_size = field_group_size.prepare(builder, &0);
                let prepared_scale_buffer_idx = field_scale_buffer_idx.prepare(builder, &0);
                let prepared_num_scales = field_num_scales.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<16> =
                    ::core::default::Default::default();
                if prepared_scale.is_some() {
                    table_writer.write_entry::<::planus::Offset<[f32]>>(0);
                }
                if prepared_channel_dim.is_some() {
                    table_writer.write_entry::<i32>(1);
                }
                if prepared_group_size.is_some() {
                    table_writer.write_entry::<i32>(2);
                }
                if prepared_scale_buffer_idx.is_some() {
                    table_writer.write_entry::<u32>(4);
                }
                if prepared_num_scales.is_some() {
                    table_writer.write_entry::<u32>(5);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_scale) = prepared_scale {
                            object_writer.write::<_, _, 4>(&prepared_scale);
                        }
                        if let ::core::option::Option::Some(prepared_channel_dim) =
                            prepared_channel_dim
                        {
                            object_writer.write::<_, _, 4>(&prepared_channel_dim);
                        }
                        if let ::core::option::Option::Some(prepared_group_size) =
                            prepared_group_size
                        {
                            object_writer.write::<_, _, 4>(&prepared_group_size);
                        }
                        if let ::core::option::Option::Some(prepared_scale_buffer_idx) =
                            prepared_scale_buffer_idx
                        {
                            object_writer.write::<_, _, 4>(&prepared_scale_buffer_idx);
                        }
                        if let ::core::option::Option::Some(prepared_num_scales) =
                            prepared_num_scales
                        {
                            object_writer.write::<_, _, 4>(&prepared_num_scales);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<PerChannelGroupQuant>> for PerChannelGroupQuant {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerChannelGroupQuant> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<PerChannelGroupQuant>> for PerChannelGroupQuant {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<PerChannelGroupQuant>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<PerChannelGroupQuant> for PerChannelGroupQuant {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerChannelGroupQuant> {
                PerChannelGroupQuant::create(
                    builder,
                    &self.scale,
                    self.channel_dim,
                    self.group_size,
                    self.scale_buffer_idx,
                    self.num_scales,
                )
            }
        }

        /// Builder for serializing an instance of the [PerChannelGroupQuant] type.
        ///
        /// Can be created using the [PerChannelGroupQuant::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct PerChannelGroupQuantBuilder<State>(State);

        impl PerChannelGroupQuantBuilder<()> {
            /// Setter for the [`scale` field](PerChannelGroupQuant#structfield.scale).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale<T0>(self, value: T0) -> PerChannelGroupQuantBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[f32]>>,
            {
                PerChannelGroupQuantBuilder((value,))
            }

            /// Sets the [`scale` field](PerChannelGroupQuant#structfield.scale) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale_as_null(self) -> PerChannelGroupQuantBuilder<((),)> {
                self.scale(())
            }
        }

        impl<T0> PerChannelGroupQuantBuilder<(T0,)> {
            /// Setter for the [`channel_dim` field](PerChannelGroupQuant#structfield.channel_dim).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn channel_dim<T1>(self, value: T1) -> PerChannelGroupQuantBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<i32, i32>,
            {
                let (v0,) = self.0;
                PerChannelGroupQuantBuilder((v0, value))
            }

            /// Sets the [`channel_dim` field](PerChannelGroupQuant#structfield.channel_dim) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn channel_dim_as_default(
                self,
            ) -> PerChannelGroupQuantBuilder<(T0, ::planus::DefaultValue)> {
                self.channel_dim(::planus::DefaultValue)
            }
        }

        impl<T0, T1> PerChannelGroupQuantBuilder<(T0, T1)> {
            /// Setter for the [`group_size` field](PerChannelGroupQuant#structfield.group_size).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn group_size<T2>(self, value: T2) -> PerChannelGroupQuantBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<i32, i32>,
            {
                let (v0, v1) = self.0;
                PerChannelGroupQuantBuilder((v0, v1, value))
            }

            /// Sets the [`group_size` field](PerChannelGroupQuant#structfield.group_size) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn group_size_as_default(
                self,
            ) -> PerChannelGroupQuantBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.group_size(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> PerChannelGroupQuantBuilder<(T0, T1, T2)> {
            /// Setter for the [`scale_buffer_idx` field](PerChannelGroupQuant#structfield.scale_buffer_idx).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale_buffer_idx<T3>(
                self,
                value: T3,
            ) -> PerChannelGroupQuantBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                PerChannelGroupQuantBuilder((v0, v1, v2, value))
            }

            /// Sets the [`scale_buffer_idx` field](PerChannelGroupQuant#structfield.scale_buffer_idx) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale_buffer_idx_as_default(
                self,
            ) -> PerChannelGroupQuantBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.scale_buffer_idx(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> PerChannelGroupQuantBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`num_scales` field](PerChannelGroupQuant#structfield.num_scales).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_scales<T4>(
                self,
                value: T4,
            ) -> PerChannelGroupQuantBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                PerChannelGroupQuantBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`num_scales` field](PerChannelGroupQuant#structfield.num_scales) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_scales_as_default(
                self,
            ) -> PerChannelGroupQuantBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.num_scales(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> PerChannelGroupQuantBuilder<(T0, T1, T2, T3, T4)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [PerChannelGroupQuant].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerChannelGroupQuant>
            where
                Self: ::planus::WriteAsOffset<PerChannelGroupQuant>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[f32]>>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsDefault<i32, i32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<PerChannelGroupQuant>>
            for PerChannelGroupQuantBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<PerChannelGroupQuant>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerChannelGroupQuant> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[f32]>>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsDefault<i32, i32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<PerChannelGroupQuant>>
            for PerChannelGroupQuantBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<PerChannelGroupQuant>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<PerChannelGroupQuant>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[f32]>>,
                T1: ::planus::WriteAsDefault<i32, i32>,
                T2: ::planus::WriteAsDefault<i32, i32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<PerChannelGroupQuant>
            for PerChannelGroupQuantBuilder<(T0, T1, T2, T3, T4)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<PerChannelGroupQuant> {
                let (v0, v1, v2, v3, v4) = &self.0;
                PerChannelGroupQuant::create(builder, v0, v1, v2, v3, v4)
            }
        }

        /// Reference to a deserialized [PerChannelGroupQuant].
        #[derive(Copy, Clone)]
        pub struct PerChannelGroupQuantRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> PerChannelGroupQuantRef<'a> {
            /// Getter for the [`scale` field](PerChannelGroupQuant#structfield.scale).
            #[inline]
            pub fn scale(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, f32>>> {
                self.0.access(0, "PerChannelGroupQuant", "scale")
            }

            /// Getter for the [`channel_dim` field](PerChannelGroupQuant#structfield.channel_dim).
            #[inline]
            pub fn channel_dim(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "PerChannelGroupQuant", "channel_dim")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`group_size` field](PerChannelGroupQuant#structfield.group_size).
            #[inline]
            pub fn group_size(&self) -> ::planus::Result<i32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "PerChannelGroupQuant", "group_size")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`scale_buffer_idx` field](PerChannelGroupQuant#structfield.scale_buffer_idx).
            #[inline]
            pub fn scale_buffer_idx(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "PerChannelGroupQuant", "scale_buffer_idx")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`num_scales` field](PerChannelGroupQuant#structfield.num_scales).
            #[inline]
            pub fn num_scales(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(5, "PerChannelGroupQuant", "num_scales")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for PerChannelGroupQuantRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("PerChannelGroupQuantRef");
                if let ::core::option::Option::Some(field_scale) = self.scale().transpose() {
                    f.field("scale", &field_scale);
                }
                f.field("channel_dim", &self.channel_dim());
                f.field("group_size", &self.group_size());
                f.field("scale_buffer_idx", &self.scale_buffer_idx());
                f.field("num_scales", &self.num_scales());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<PerChannelGroupQuantRef<'a>> for PerChannelGroupQuant {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: PerChannelGroupQuantRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    scale: if let ::core::option::Option::Some(scale) = value.scale()? {
                        ::core::option::Option::Some(scale.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    channel_dim: ::core::convert::TryInto::try_into(value.channel_dim()?)?,
                    group_size: ::core::convert::TryInto::try_into(value.group_size()?)?,
                    scale_buffer_idx: ::core::convert::TryInto::try_into(
                        value.scale_buffer_idx()?,
                    )?,
                    num_scales: ::core::convert::TryInto::try_into(value.num_scales()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for PerChannelGroupQuantRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for PerChannelGroupQuantRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[PerChannelGroupQuantRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<PerChannelGroupQuant>> for PerChannelGroupQuant {
            type Value = ::planus::Offset<PerChannelGroupQuant>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<PerChannelGroupQuant>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for PerChannelGroupQuantRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[PerChannelGroupQuantRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNTensorValue` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNTensorValue` in the file `schema/xnnpack.fbs:88`
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
        pub struct XnnTensorValue {
            /// The field `datatype` in the table `XNNTensorValue`
            pub datatype: self::XnnDatatype,
            /// The field `num_dims` in the table `XNNTensorValue`
            pub num_dims: u32,
            /// The field `dims` in the table `XNNTensorValue`
            pub dims: ::core::option::Option<::planus::alloc::vec::Vec<u32>>,
            /// The field `constant_buffer_idx` in the table `XNNTensorValue`
            pub constant_buffer_idx: u32,
            /// The field `external_id` in the table `XNNTensorValue`
            pub external_id: u32,
            /// The field `flags` in the table `XNNTensorValue`
            pub flags: u32,
            /// The field `id_out` in the table `XNNTensorValue`
            pub id_out: u32,
            /// The field `dq_datatype` in the table `XNNTensorValue`
            pub dq_datatype: self::XnnDatatype,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnTensorValue {
            fn default() -> Self {
                Self {
                    datatype: self::XnnDatatype::XnnDatatypeInvalid,
                    num_dims: 0,
                    dims: ::core::default::Default::default(),
                    constant_buffer_idx: 0,
                    external_id: 0,
                    flags: 0,
                    id_out: 0,
                    dq_datatype: self::XnnDatatype::XnnDatatypeInvalid,
                }
            }
        }

        impl XnnTensorValue {
            /// Creates a [XnnTensorValueBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnTensorValueBuilder<()> {
                XnnTensorValueBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_datatype: impl ::planus::WriteAsDefault<self::XnnDatatype, self::XnnDatatype>,
                field_num_dims: impl ::planus::WriteAsDefault<u32, u32>,
                field_dims: impl ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                field_constant_buffer_idx: impl ::planus::WriteAsDefault<u32, u32>,
                field_external_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
                field_id_out: impl ::planus::WriteAsDefault<u32, u32>,
                field_dq_datatype: impl ::planus::WriteAsDefault<self::XnnDatatype, self::XnnDatatype>,
            ) -> ::planus::Offset<Self> {
                let prepared_datatype =
                    field_datatype.prepare(builder, &self::XnnDatatype::XnnDatatypeInvalid);
                let prepared_num_dims = field_num_dims.prepare(builder, &0);
                let prepared_dims = field_dims.prepare(builder);
                let prepared_constant_buffer_idx = field_constant_buffer_idx.prepare(builder, &0);
                let prepared_external_id = field_external_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);
                let prepared_id_out = field_id_out.prepare(builder, &0);
                let prepared_dq_datatype =
                    field_dq_datatype.prepare(builder, &self::XnnDatatype::XnnDatatypeInvalid);

                let mut table_writer: ::planus::table_writer::TableWriter<20> =
                    ::core::default::Default::default();
                if prepared_num_dims.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_dims.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u32]>>(2);
                }
                if prepared_constant_buffer_idx.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_external_id.is_some() {
                    table_writer.write_entry::<u32>(4);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(5);
                }
                if prepared_id_out.is_some() {
                    table_writer.write_entry::<u32>(6);
                }
                if prepared_datatype.is_some() {
                    table_writer.write_entry::<self::XnnDatatype>(0);
                }
                if prepared_dq_datatype.is_some() {
                    table_writer.write_entry::<self::XnnDatatype>(7);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_num_dims) = prepared_num_dims {
                            object_writer.write::<_, _, 4>(&prepared_num_dims);
                        }
                        if let ::core::option::Option::Some(prepared_dims) = prepared_dims {
                            object_writer.write::<_, _, 4>(&prepared_dims);
                        }
                        if let ::core::option::Option::Some(prepared_constant_buffer_idx) =
                            prepared_constant_buffer_idx
                        {
                            object_writer.write::<_, _, 4>(&prepared_constant_buffer_idx);
                        }
                        if let ::core::option::Option::Some(prepared_external_id) =
                            prepared_external_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_external_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                        if let ::core::option::Option::Some(prepared_id_out) = prepared_id_out {
                            object_writer.write::<_, _, 4>(&prepared_id_out);
                        }
                        if let ::core::option::Option::Some(prepared_datatype) = prepared_datatype {
                            object_writer.write::<_, _, 2>(&prepared_datatype);
                        }
                        if let ::core::option::Option::Some(prepared_dq_datatype) =
                            prepared_dq_datatype
                        {
                            object_writer.write::<_, _, 2>(&prepared_dq_datatype);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnTensorValue>> for XnnTensorValue {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnTensorValue> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnTensorValue>> for XnnTensorValue {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnTensorValue>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnTensorValue> for XnnTensorValue {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnTensorValue> {
                XnnTensorValue::create(
                    builder,
                    self.datatype,
                    self.num_dims,
                    &self.dims,
                    self.constant_buffer_idx,
                    self.external_id,
                    self.flags,
                    self.id_out,
                    self.dq_datatype,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnTensorValue] type.
        ///
        /// Can be created using the [XnnTensorValue::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnTensorValueBuilder<State>(State);

        impl XnnTensorValueBuilder<()> {
            /// Setter for the [`datatype` field](XnnTensorValue#structfield.datatype).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn datatype<T0>(self, value: T0) -> XnnTensorValueBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<self::XnnDatatype, self::XnnDatatype>,
            {
                XnnTensorValueBuilder((value,))
            }

            /// Sets the [`datatype` field](XnnTensorValue#structfield.datatype) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn datatype_as_default(self) -> XnnTensorValueBuilder<(::planus::DefaultValue,)> {
                self.datatype(::planus::DefaultValue)
            }
        }

        impl<T0> XnnTensorValueBuilder<(T0,)> {
            /// Setter for the [`num_dims` field](XnnTensorValue#structfield.num_dims).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_dims<T1>(self, value: T1) -> XnnTensorValueBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnTensorValueBuilder((v0, value))
            }

            /// Sets the [`num_dims` field](XnnTensorValue#structfield.num_dims) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_dims_as_default(
                self,
            ) -> XnnTensorValueBuilder<(T0, ::planus::DefaultValue)> {
                self.num_dims(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnTensorValueBuilder<(T0, T1)> {
            /// Setter for the [`dims` field](XnnTensorValue#structfield.dims).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dims<T2>(self, value: T2) -> XnnTensorValueBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
            {
                let (v0, v1) = self.0;
                XnnTensorValueBuilder((v0, v1, value))
            }

            /// Sets the [`dims` field](XnnTensorValue#structfield.dims) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dims_as_null(self) -> XnnTensorValueBuilder<(T0, T1, ())> {
                self.dims(())
            }
        }

        impl<T0, T1, T2> XnnTensorValueBuilder<(T0, T1, T2)> {
            /// Setter for the [`constant_buffer_idx` field](XnnTensorValue#structfield.constant_buffer_idx).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn constant_buffer_idx<T3>(
                self,
                value: T3,
            ) -> XnnTensorValueBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnTensorValueBuilder((v0, v1, v2, value))
            }

            /// Sets the [`constant_buffer_idx` field](XnnTensorValue#structfield.constant_buffer_idx) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn constant_buffer_idx_as_default(
                self,
            ) -> XnnTensorValueBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.constant_buffer_idx(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnTensorValueBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`external_id` field](XnnTensorValue#structfield.external_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn external_id<T4>(self, value: T4) -> XnnTensorValueBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnTensorValueBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`external_id` field](XnnTensorValue#structfield.external_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn external_id_as_default(
                self,
            ) -> XnnTensorValueBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.external_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnTensorValueBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`flags` field](XnnTensorValue#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T5>(self, value: T5) -> XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                XnnTensorValueBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`flags` field](XnnTensorValue#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnTensorValueBuilder<(T0, T1, T2, T3, T4, ::planus::DefaultValue)> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5> XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Setter for the [`id_out` field](XnnTensorValue#structfield.id_out).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn id_out<T6>(
                self,
                value: T6,
            ) -> XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5, T6)>
            where
                T6: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5) = self.0;
                XnnTensorValueBuilder((v0, v1, v2, v3, v4, v5, value))
            }

            /// Sets the [`id_out` field](XnnTensorValue#structfield.id_out) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn id_out_as_default(
                self,
            ) -> XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5, ::planus::DefaultValue)>
            {
                self.id_out(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6> XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5, T6)> {
            /// Setter for the [`dq_datatype` field](XnnTensorValue#structfield.dq_datatype).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dq_datatype<T7>(
                self,
                value: T7,
            ) -> XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
            where
                T7: ::planus::WriteAsDefault<self::XnnDatatype, self::XnnDatatype>,
            {
                let (v0, v1, v2, v3, v4, v5, v6) = self.0;
                XnnTensorValueBuilder((v0, v1, v2, v3, v4, v5, v6, value))
            }

            /// Sets the [`dq_datatype` field](XnnTensorValue#structfield.dq_datatype) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dq_datatype_as_default(
                self,
            ) -> XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5, T6, ::planus::DefaultValue)>
            {
                self.dq_datatype(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7> XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnTensorValue].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnTensorValue>
            where
                Self: ::planus::WriteAsOffset<XnnTensorValue>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<self::XnnDatatype, self::XnnDatatype>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<self::XnnDatatype, self::XnnDatatype>,
            > ::planus::WriteAs<::planus::Offset<XnnTensorValue>>
            for XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
        {
            type Prepared = ::planus::Offset<XnnTensorValue>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnTensorValue> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<self::XnnDatatype, self::XnnDatatype>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<self::XnnDatatype, self::XnnDatatype>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnTensorValue>>
            for XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
        {
            type Prepared = ::planus::Offset<XnnTensorValue>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnTensorValue>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<self::XnnDatatype, self::XnnDatatype>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<self::XnnDatatype, self::XnnDatatype>,
            > ::planus::WriteAsOffset<XnnTensorValue>
            for XnnTensorValueBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnTensorValue> {
                let (v0, v1, v2, v3, v4, v5, v6, v7) = &self.0;
                XnnTensorValue::create(builder, v0, v1, v2, v3, v4, v5, v6, v7)
            }
        }

        /// Reference to a deserialized [XnnTensorValue].
        #[derive(Copy, Clone)]
        pub struct XnnTensorValueRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnTensorValueRef<'a> {
            /// Getter for the [`datatype` field](XnnTensorValue#structfield.datatype).
            #[inline]
            pub fn datatype(&self) -> ::planus::Result<self::XnnDatatype> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "XnnTensorValue", "datatype")?
                        .unwrap_or(self::XnnDatatype::XnnDatatypeInvalid),
                )
            }

            /// Getter for the [`num_dims` field](XnnTensorValue#structfield.num_dims).
            #[inline]
            pub fn num_dims(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(1, "XnnTensorValue", "num_dims")?.unwrap_or(0),
                )
            }

            /// Getter for the [`dims` field](XnnTensorValue#structfield.dims).
            #[inline]
            pub fn dims(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u32>>> {
                self.0.access(2, "XnnTensorValue", "dims")
            }

            /// Getter for the [`constant_buffer_idx` field](XnnTensorValue#structfield.constant_buffer_idx).
            #[inline]
            pub fn constant_buffer_idx(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "XnnTensorValue", "constant_buffer_idx")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`external_id` field](XnnTensorValue#structfield.external_id).
            #[inline]
            pub fn external_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "XnnTensorValue", "external_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnTensorValue#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(5, "XnnTensorValue", "flags")?.unwrap_or(0),
                )
            }

            /// Getter for the [`id_out` field](XnnTensorValue#structfield.id_out).
            #[inline]
            pub fn id_out(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(6, "XnnTensorValue", "id_out")?.unwrap_or(0),
                )
            }

            /// Getter for the [`dq_datatype` field](XnnTensorValue#structfield.dq_datatype).
            #[inline]
            pub fn dq_datatype(&self) -> ::planus::Result<self::XnnDatatype> {
                ::core::result::Result::Ok(
                    self.0
                        .access(7, "XnnTensorValue", "dq_datatype")?
                        .unwrap_or(self::XnnDatatype::XnnDatatypeInvalid),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for XnnTensorValueRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnTensorValueRef");
                f.field("datatype", &self.datatype());
                f.field("num_dims", &self.num_dims());
                if let ::core::option::Option::Some(field_dims) = self.dims().transpose() {
                    f.field("dims", &field_dims);
                }
                f.field("constant_buffer_idx", &self.constant_buffer_idx());
                f.field("external_id", &self.external_id());
                f.field("flags", &self.flags());
                f.field("id_out", &self.id_out());
                f.field("dq_datatype", &self.dq_datatype());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnTensorValueRef<'a>> for XnnTensorValue {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnTensorValueRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    datatype: ::core::convert::TryInto::try_into(value.datatype()?)?,
                    num_dims: ::core::convert::TryInto::try_into(value.num_dims()?)?,
                    dims: if let ::core::option::Option::Some(dims) = value.dims()? {
                        ::core::option::Option::Some(dims.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    constant_buffer_idx: ::core::convert::TryInto::try_into(
                        value.constant_buffer_idx()?,
                    )?,
                    external_id: ::core::convert::TryInto::try_into(value.external_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                    id_out: ::core::convert::TryInto::try_into(value.id_out()?)?,
                    dq_datatype: ::core::convert::TryInto::try_into(value.dq_datatype()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnTensorValueRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnTensorValueRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnTensorValueRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnTensorValue>> for XnnTensorValue {
            type Value = ::planus::Offset<XnnTensorValue>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnTensorValue>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnTensorValueRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnTensorValueRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNQuantizedTensorValue` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNQuantizedTensorValue` in the file `schema/xnnpack.fbs:107`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct XnnQuantizedTensorValue {
            /// The field `tensor_value` in the table `XNNQuantizedTensorValue`
            pub tensor_value:
                ::core::option::Option<::planus::alloc::boxed::Box<self::XnnTensorValue>>,
            /// The field `quant_params` in the table `XNNQuantizedTensorValue`
            pub quant_params: ::core::option::Option<self::XnnQuantParams>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnQuantizedTensorValue {
            fn default() -> Self {
                Self {
                    tensor_value: ::core::default::Default::default(),
                    quant_params: ::core::default::Default::default(),
                }
            }
        }

        impl XnnQuantizedTensorValue {
            /// Creates a [XnnQuantizedTensorValueBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnQuantizedTensorValueBuilder<()> {
                XnnQuantizedTensorValueBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_tensor_value: impl ::planus::WriteAsOptional<
                    ::planus::Offset<self::XnnTensorValue>,
                >,
                field_quant_params: impl ::planus::WriteAsOptionalUnion<self::XnnQuantParams>,
            ) -> ::planus::Offset<Self> {
                let prepared_tensor_value = field_tensor_value.prepare(builder);
                let prepared_quant_params = field_quant_params.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<10> =
                    ::core::default::Default::default();
                if prepared_tensor_value.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::XnnTensorValue>>(0);
                }
                if prepared_quant_params.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::XnnQuantParams>>(2);
                }
                if prepared_quant_params.is_some() {
                    table_writer.write_entry::<u8>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_tensor_value) =
                            prepared_tensor_value
                        {
                            object_writer.write::<_, _, 4>(&prepared_tensor_value);
                        }
                        if let ::core::option::Option::Some(prepared_quant_params) =
                            prepared_quant_params
                        {
                            object_writer.write::<_, _, 4>(&prepared_quant_params.offset());
                        }
                        if let ::core::option::Option::Some(prepared_quant_params) =
                            prepared_quant_params
                        {
                            object_writer.write::<_, _, 1>(&prepared_quant_params.tag());
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnQuantizedTensorValue>> for XnnQuantizedTensorValue {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnQuantizedTensorValue> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnQuantizedTensorValue>>
            for XnnQuantizedTensorValue
        {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnQuantizedTensorValue>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnQuantizedTensorValue> for XnnQuantizedTensorValue {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnQuantizedTensorValue> {
                XnnQuantizedTensorValue::create(builder, &self.tensor_value, &self.quant_params)
            }
        }

        /// Builder for serializing an instance of the [XnnQuantizedTensorValue] type.
        ///
        /// Can be created using the [XnnQuantizedTensorValue::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnQuantizedTensorValueBuilder<State>(State);

        impl XnnQuantizedTensorValueBuilder<()> {
            /// Setter for the [`tensor_value` field](XnnQuantizedTensorValue#structfield.tensor_value).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn tensor_value<T0>(self, value: T0) -> XnnQuantizedTensorValueBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<self::XnnTensorValue>>,
            {
                XnnQuantizedTensorValueBuilder((value,))
            }

            /// Sets the [`tensor_value` field](XnnQuantizedTensorValue#structfield.tensor_value) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn tensor_value_as_null(self) -> XnnQuantizedTensorValueBuilder<((),)> {
                self.tensor_value(())
            }
        }

        impl<T0> XnnQuantizedTensorValueBuilder<(T0,)> {
            /// Setter for the [`quant_params` field](XnnQuantizedTensorValue#structfield.quant_params).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn quant_params<T1>(self, value: T1) -> XnnQuantizedTensorValueBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptionalUnion<self::XnnQuantParams>,
            {
                let (v0,) = self.0;
                XnnQuantizedTensorValueBuilder((v0, value))
            }

            /// Sets the [`quant_params` field](XnnQuantizedTensorValue#structfield.quant_params) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn quant_params_as_null(self) -> XnnQuantizedTensorValueBuilder<(T0, ())> {
                self.quant_params(())
            }
        }

        impl<T0, T1> XnnQuantizedTensorValueBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnQuantizedTensorValue].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnQuantizedTensorValue>
            where
                Self: ::planus::WriteAsOffset<XnnQuantizedTensorValue>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<self::XnnTensorValue>>,
                T1: ::planus::WriteAsOptionalUnion<self::XnnQuantParams>,
            > ::planus::WriteAs<::planus::Offset<XnnQuantizedTensorValue>>
            for XnnQuantizedTensorValueBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<XnnQuantizedTensorValue>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnQuantizedTensorValue> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<self::XnnTensorValue>>,
                T1: ::planus::WriteAsOptionalUnion<self::XnnQuantParams>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnQuantizedTensorValue>>
            for XnnQuantizedTensorValueBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<XnnQuantizedTensorValue>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnQuantizedTensorValue>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<self::XnnTensorValue>>,
                T1: ::planus::WriteAsOptionalUnion<self::XnnQuantParams>,
            > ::planus::WriteAsOffset<XnnQuantizedTensorValue>
            for XnnQuantizedTensorValueBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnQuantizedTensorValue> {
                let (v0, v1) = &self.0;
                XnnQuantizedTensorValue::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [XnnQuantizedTensorValue].
        #[derive(Copy, Clone)]
        pub struct XnnQuantizedTensorValueRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> XnnQuantizedTensorValueRef<'a> {
            /// Getter for the [`tensor_value` field](XnnQuantizedTensorValue#structfield.tensor_value).
            #[inline]
            pub fn tensor_value(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::XnnTensorValueRef<'a>>> {
                self.0.access(0, "XnnQuantizedTensorValue", "tensor_value")
            }

            /// Getter for the [`quant_params` field](XnnQuantizedTensorValue#structfield.quant_params).
            #[inline]
            pub fn quant_params(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::XnnQuantParamsRef<'a>>> {
                self.0
                    .access_union(1, "XnnQuantizedTensorValue", "quant_params")
            }
        }

        impl<'a> ::core::fmt::Debug for XnnQuantizedTensorValueRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnQuantizedTensorValueRef");
                if let ::core::option::Option::Some(field_tensor_value) =
                    self.tensor_value().transpose()
                {
                    f.field("tensor_value", &field_tensor_value);
                }
                if let ::core::option::Option::Some(field_quant_params) =
                    self.quant_params().transpose()
                {
                    f.field("quant_params", &field_quant_params);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnQuantizedTensorValueRef<'a>> for XnnQuantizedTensorValue {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnQuantizedTensorValueRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    tensor_value: if let ::core::option::Option::Some(tensor_value) =
                        value.tensor_value()?
                    {
                        ::core::option::Option::Some(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryInto::try_into(tensor_value)?,
                        ))
                    } else {
                        ::core::option::Option::None
                    },
                    quant_params: if let ::core::option::Option::Some(quant_params) =
                        value.quant_params()?
                    {
                        ::core::option::Option::Some(::core::convert::TryInto::try_into(
                            quant_params,
                        )?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnQuantizedTensorValueRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnQuantizedTensorValueRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnQuantizedTensorValueRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnQuantizedTensorValue>>
            for XnnQuantizedTensorValue
        {
            type Value = ::planus::Offset<XnnQuantizedTensorValue>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnQuantizedTensorValue>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnQuantizedTensorValueRef<'a> {
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
                        "[XnnQuantizedTensorValueRef]",
                        "read_as_root",
                        0,
                    )
                })
            }
        }

        /// The union `XNodeUnion` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Union `XNodeUnion` in the file `schema/xnnpack.fbs:112`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub enum XNodeUnion {
            /// The variant `XNNAdd` in the union `XNodeUnion`
            XnnAdd(::planus::alloc::boxed::Box<self::XnnNode2x1>),

            /// The variant of type `XNNFullyConnected` in the union `XNodeUnion`
            XnnFullyConnected(::planus::alloc::boxed::Box<self::XnnFullyConnected>),

            /// The variant `XNNSoftmax` in the union `XNodeUnion`
            XnnSoftmax(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNSigmoid` in the union `XNodeUnion`
            XnnSigmoid(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant of type `XNNStaticTranspose` in the union `XNodeUnion`
            XnnStaticTranspose(::planus::alloc::boxed::Box<self::XnnStaticTranspose>),

            /// The variant `XNNClamp` in the union `XNodeUnion`
            XnnClamp(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNConv2d` in the union `XNodeUnion`
            XnnConv2d(::planus::alloc::boxed::Box<self::XnnNodeConv>),

            /// The variant `XNNDiv` in the union `XNodeUnion`
            XnnDiv(::planus::alloc::boxed::Box<self::XnnNode2x1>),

            /// The variant of type `XNNStaticResizeBilinear2D` in the union `XNodeUnion`
            XnnStaticResizeBilinear2D(::planus::alloc::boxed::Box<self::XnnStaticResizeBilinear2D>),

            /// The variant of type `XNNStaticConstantPad` in the union `XNodeUnion`
            XnnStaticConstantPad(::planus::alloc::boxed::Box<self::XnnStaticConstantPad>),

            /// The variant `XNNAvgPooling2d` in the union `XNodeUnion`
            XnnAvgPooling2d(::planus::alloc::boxed::Box<self::XnnPooling2D>),

            /// The variant `XNNMinimum` in the union `XNodeUnion`
            XnnMinimum(::planus::alloc::boxed::Box<self::XnnNode2x1>),

            /// The variant `XNNDepthwiseConv2d` in the union `XNodeUnion`
            XnnDepthwiseConv2d(::planus::alloc::boxed::Box<self::XnnNodeConv>),

            /// The variant `XNNMaxPooling2d` in the union `XNodeUnion`
            XnnMaxPooling2d(::planus::alloc::boxed::Box<self::XnnPooling2D>),

            /// The variant `XNNMultiply` in the union `XNodeUnion`
            XnnMultiply(::planus::alloc::boxed::Box<self::XnnNode2x1>),

            /// The variant `XNNSubtract` in the union `XNodeUnion`
            XnnSubtract(::planus::alloc::boxed::Box<self::XnnNode2x1>),

            /// The variant `XNNFloor` in the union `XNodeUnion`
            XnnFloor(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNConvert` in the union `XNodeUnion`
            XnnConvert(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNGlobalAvgPooling2d` in the union `XNodeUnion`
            XnnGlobalAvgPooling2d(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant of type `XNNStaticReshape` in the union `XNodeUnion`
            XnnStaticReshape(::planus::alloc::boxed::Box<self::XnnStaticReshape>),

            /// The variant of type `XNNArgMaxPooling2d` in the union `XNodeUnion`
            XnnArgMaxPooling2d(::planus::alloc::boxed::Box<self::XnnArgMaxPooling2d>),

            /// The variant `XNNSquareRoot` in the union `XNodeUnion`
            XnnSquareRoot(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNCeiling` in the union `XNodeUnion`
            XnnCeiling(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNHardswish` in the union `XNodeUnion`
            XnnHardswish(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant of type `XNNLeakyReLU` in the union `XNodeUnion`
            XnnLeakyReLu(::planus::alloc::boxed::Box<self::XnnLeakyReLu>),

            /// The variant `XNNMaximum` in the union `XNodeUnion`
            XnnMaximum(::planus::alloc::boxed::Box<self::XnnNode2x1>),

            /// The variant `XNNNegate` in the union `XNodeUnion`
            XnnNegate(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNSquare` in the union `XNodeUnion`
            XnnSquare(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant of type `XNNELU` in the union `XNodeUnion`
            Xnnelu(::planus::alloc::boxed::Box<self::Xnnelu>),

            /// The variant `XNNAbs` in the union `XNodeUnion`
            XnnAbs(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNPReLU` in the union `XNodeUnion`
            XnnpReLu(::planus::alloc::boxed::Box<self::XnnNode2x1>),

            /// The variant `XNNConcatenate2` in the union `XNodeUnion`
            XnnConcatenate2(::planus::alloc::boxed::Box<self::XnnCat>),

            /// The variant `XNNConcatenate3` in the union `XNodeUnion`
            XnnConcatenate3(::planus::alloc::boxed::Box<self::XnnCat>),

            /// The variant `XNNConcatenate4` in the union `XNodeUnion`
            XnnConcatenate4(::planus::alloc::boxed::Box<self::XnnCat>),

            /// The variant of type `XNNStaticSlice` in the union `XNodeUnion`
            XnnStaticSlice(::planus::alloc::boxed::Box<self::XnnStaticSlice>),

            /// The variant of type `XNNScaledDotProductAttention` in the union `XNodeUnion`
            XnnScaledDotProductAttention(
                ::planus::alloc::boxed::Box<self::XnnScaledDotProductAttention>,
            ),

            /// The variant `XNNBatchMatrixMultiply` in the union `XNodeUnion`
            XnnBatchMatrixMultiply(::planus::alloc::boxed::Box<self::XnnNode2x1>),

            /// The variant `XNNConcatenate5` in the union `XNodeUnion`
            XnnConcatenate5(::planus::alloc::boxed::Box<self::XnnCat>),

            /// The variant `XNNConvTranspose2d` in the union `XNodeUnion`
            XnnConvTranspose2d(::planus::alloc::boxed::Box<self::XnnNodeConv>),

            /// The variant `XNNReciprocalSquareRoot` in the union `XNodeUnion`
            XnnReciprocalSquareRoot(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNLog` in the union `XNodeUnion`
            XnnLog(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNGelu` in the union `XNodeUnion`
            XnnGelu(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNTanh` in the union `XNodeUnion`
            XnnTanh(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNExp` in the union `XNodeUnion`
            XnnExp(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNSin` in the union `XNodeUnion`
            XnnSin(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNCopy` in the union `XNodeUnion`
            XnnCopy(::planus::alloc::boxed::Box<self::XnnNode1x1>),

            /// The variant `XNNCos` in the union `XNodeUnion`
            XnnCos(::planus::alloc::boxed::Box<self::XnnNode1x1>),
        }

        impl XNodeUnion {
            /// Creates a [XNodeUnionBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XNodeUnionBuilder<::planus::Uninitialized> {
                XNodeUnionBuilder(::planus::Uninitialized)
            }

            #[inline]
            pub fn create_xnn_add(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode2x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(1, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_fully_connected(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnFullyConnected>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(2, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_softmax(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(3, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_sigmoid(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(4, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_static_transpose(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnStaticTranspose>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(5, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_clamp(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(6, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_conv2d(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNodeConv>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(7, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_div(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode2x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(8, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_static_resize_bilinear2_d(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnStaticResizeBilinear2D>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(9, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_static_constant_pad(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnStaticConstantPad>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(10, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_avg_pooling2d(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnPooling2D>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(11, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_minimum(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode2x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(12, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_depthwise_conv2d(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNodeConv>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(13, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_max_pooling2d(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnPooling2D>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(14, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_multiply(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode2x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(15, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_subtract(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode2x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(16, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_floor(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(17, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_convert(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(18, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_global_avg_pooling2d(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(19, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_static_reshape(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnStaticReshape>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(20, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_arg_max_pooling2d(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnArgMaxPooling2d>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(21, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_square_root(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(22, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_ceiling(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(23, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_hardswish(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(24, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_leaky_re_lu(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnLeakyReLu>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(25, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_maximum(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode2x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(26, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_negate(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(27, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_square(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(28, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnnelu(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::Xnnelu>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(29, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_abs(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(30, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnnp_re_lu(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode2x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(31, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_concatenate2(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnCat>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(32, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_concatenate3(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnCat>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(33, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_concatenate4(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnCat>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(34, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_static_slice(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnStaticSlice>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(35, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_scaled_dot_product_attention(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnScaledDotProductAttention>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(36, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_batch_matrix_multiply(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode2x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(37, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_concatenate5(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnCat>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(38, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_conv_transpose2d(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNodeConv>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(39, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_reciprocal_square_root(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(40, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_log(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(41, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_gelu(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(42, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_tanh(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(43, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_exp(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(44, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_sin(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(45, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_copy(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(46, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_cos(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnNode1x1>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(47, value.prepare(builder).downcast())
            }
        }

        impl ::planus::WriteAsUnion<XNodeUnion> for XNodeUnion {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::UnionOffset<Self> {
                match self {
                    Self::XnnAdd(value) => Self::create_xnn_add(builder, value),
                    Self::XnnFullyConnected(value) => {
                        Self::create_xnn_fully_connected(builder, value)
                    }
                    Self::XnnSoftmax(value) => Self::create_xnn_softmax(builder, value),
                    Self::XnnSigmoid(value) => Self::create_xnn_sigmoid(builder, value),
                    Self::XnnStaticTranspose(value) => {
                        Self::create_xnn_static_transpose(builder, value)
                    }
                    Self::XnnClamp(value) => Self::create_xnn_clamp(builder, value),
                    Self::XnnConv2d(value) => Self::create_xnn_conv2d(builder, value),
                    Self::XnnDiv(value) => Self::create_xnn_div(builder, value),
                    Self::XnnStaticResizeBilinear2D(value) => {
                        Self::create_xnn_static_resize_bilinear2_d(builder, value)
                    }
                    Self::XnnStaticConstantPad(value) => {
                        Self::create_xnn_static_constant_pad(builder, value)
                    }
                    Self::XnnAvgPooling2d(value) => Self::create_xnn_avg_pooling2d(builder, value),
                    Self::XnnMinimum(value) => Self::create_xnn_minimum(builder, value),
                    Self::XnnDepthwiseConv2d(value) => {
                        Self::create_xnn_depthwise_conv2d(builder, value)
                    }
                    Self::XnnMaxPooling2d(value) => Self::create_xnn_max_pooling2d(builder, value),
                    Self::XnnMultiply(value) => Self::create_xnn_multiply(builder, value),
                    Self::XnnSubtract(value) => Self::create_xnn_subtract(builder, value),
                    Self::XnnFloor(value) => Self::create_xnn_floor(builder, value),
                    Self::XnnConvert(value) => Self::create_xnn_convert(builder, value),
                    Self::XnnGlobalAvgPooling2d(value) => {
                        Self::create_xnn_global_avg_pooling2d(builder, value)
                    }
                    Self::XnnStaticReshape(value) => {
                        Self::create_xnn_static_reshape(builder, value)
                    }
                    Self::XnnArgMaxPooling2d(value) => {
                        Self::create_xnn_arg_max_pooling2d(builder, value)
                    }
                    Self::XnnSquareRoot(value) => Self::create_xnn_square_root(builder, value),
                    Self::XnnCeiling(value) => Self::create_xnn_ceiling(builder, value),
                    Self::XnnHardswish(value) => Self::create_xnn_hardswish(builder, value),
                    Self::XnnLeakyReLu(value) => Self::create_xnn_leaky_re_lu(builder, value),
                    Self::XnnMaximum(value) => Self::create_xnn_maximum(builder, value),
                    Self::XnnNegate(value) => Self::create_xnn_negate(builder, value),
                    Self::XnnSquare(value) => Self::create_xnn_square(builder, value),
                    Self::Xnnelu(value) => Self::create_xnnelu(builder, value),
                    Self::XnnAbs(value) => Self::create_xnn_abs(builder, value),
                    Self::XnnpReLu(value) => Self::create_xnnp_re_lu(builder, value),
                    Self::XnnConcatenate2(value) => Self::create_xnn_concatenate2(builder, value),
                    Self::XnnConcatenate3(value) => Self::create_xnn_concatenate3(builder, value),
                    Self::XnnConcatenate4(value) => Self::create_xnn_concatenate4(builder, value),
                    Self::XnnStaticSlice(value) => Self::create_xnn_static_slice(builder, value),
                    Self::XnnScaledDotProductAttention(value) => {
                        Self::create_xnn_scaled_dot_product_attention(builder, value)
                    }
                    Self::XnnBatchMatrixMultiply(value) => {
                        Self::create_xnn_batch_matrix_multiply(builder, value)
                    }
                    Self::XnnConcatenate5(value) => Self::create_xnn_concatenate5(builder, value),
                    Self::XnnConvTranspose2d(value) => {
                        Self::create_xnn_conv_transpose2d(builder, value)
                    }
                    Self::XnnReciprocalSquareRoot(value) => {
                        Self::create_xnn_reciprocal_square_root(builder, value)
                    }
                    Self::XnnLog(value) => Self::create_xnn_log(builder, value),
                    Self::XnnGelu(value) => Self::create_xnn_gelu(builder, value),
                    Self::XnnTanh(value) => Self::create_xnn_tanh(builder, value),
                    Self::XnnExp(value) => Self::create_xnn_exp(builder, value),
                    Self::XnnSin(value) => Self::create_xnn_sin(builder, value),
                    Self::XnnCopy(value) => Self::create_xnn_copy(builder, value),
                    Self::XnnCos(value) => Self::create_xnn_cos(builder, value),
                }
            }
        }

        impl ::planus::WriteAsOptionalUnion<XNodeUnion> for XNodeUnion {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<Self>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Builder for serializing an instance of the [XNodeUnion] type.
        ///
        /// Can be created using the [XNodeUnion::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XNodeUnionBuilder<T>(T);

        impl XNodeUnionBuilder<::planus::Uninitialized> {
            /// Creates an instance of the [`XNNAdd` variant](XNodeUnion#variant.XnnAdd).
            #[inline]
            pub fn xnn_add<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<1, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode2x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNFullyConnected` variant](XNodeUnion#variant.XnnFullyConnected).
            #[inline]
            pub fn xnn_fully_connected<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<2, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnFullyConnected>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNSoftmax` variant](XNodeUnion#variant.XnnSoftmax).
            #[inline]
            pub fn xnn_softmax<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<3, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNSigmoid` variant](XNodeUnion#variant.XnnSigmoid).
            #[inline]
            pub fn xnn_sigmoid<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<4, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNStaticTranspose` variant](XNodeUnion#variant.XnnStaticTranspose).
            #[inline]
            pub fn xnn_static_transpose<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<5, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnStaticTranspose>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNClamp` variant](XNodeUnion#variant.XnnClamp).
            #[inline]
            pub fn xnn_clamp<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<6, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNConv2d` variant](XNodeUnion#variant.XnnConv2d).
            #[inline]
            pub fn xnn_conv2d<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<7, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNodeConv>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNDiv` variant](XNodeUnion#variant.XnnDiv).
            #[inline]
            pub fn xnn_div<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<8, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode2x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNStaticResizeBilinear2D` variant](XNodeUnion#variant.XnnStaticResizeBilinear2D).
            #[inline]
            pub fn xnn_static_resize_bilinear2_d<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<9, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnStaticResizeBilinear2D>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNStaticConstantPad` variant](XNodeUnion#variant.XnnStaticConstantPad).
            #[inline]
            pub fn xnn_static_constant_pad<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<10, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnStaticConstantPad>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNAvgPooling2d` variant](XNodeUnion#variant.XnnAvgPooling2d).
            #[inline]
            pub fn xnn_avg_pooling2d<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<11, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnPooling2D>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNMinimum` variant](XNodeUnion#variant.XnnMinimum).
            #[inline]
            pub fn xnn_minimum<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<12, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode2x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNDepthwiseConv2d` variant](XNodeUnion#variant.XnnDepthwiseConv2d).
            #[inline]
            pub fn xnn_depthwise_conv2d<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<13, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNodeConv>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNMaxPooling2d` variant](XNodeUnion#variant.XnnMaxPooling2d).
            #[inline]
            pub fn xnn_max_pooling2d<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<14, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnPooling2D>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNMultiply` variant](XNodeUnion#variant.XnnMultiply).
            #[inline]
            pub fn xnn_multiply<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<15, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode2x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNSubtract` variant](XNodeUnion#variant.XnnSubtract).
            #[inline]
            pub fn xnn_subtract<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<16, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode2x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNFloor` variant](XNodeUnion#variant.XnnFloor).
            #[inline]
            pub fn xnn_floor<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<17, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNConvert` variant](XNodeUnion#variant.XnnConvert).
            #[inline]
            pub fn xnn_convert<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<18, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNGlobalAvgPooling2d` variant](XNodeUnion#variant.XnnGlobalAvgPooling2d).
            #[inline]
            pub fn xnn_global_avg_pooling2d<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<19, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNStaticReshape` variant](XNodeUnion#variant.XnnStaticReshape).
            #[inline]
            pub fn xnn_static_reshape<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<20, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnStaticReshape>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNArgMaxPooling2d` variant](XNodeUnion#variant.XnnArgMaxPooling2d).
            #[inline]
            pub fn xnn_arg_max_pooling2d<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<21, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnArgMaxPooling2d>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNSquareRoot` variant](XNodeUnion#variant.XnnSquareRoot).
            #[inline]
            pub fn xnn_square_root<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<22, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNCeiling` variant](XNodeUnion#variant.XnnCeiling).
            #[inline]
            pub fn xnn_ceiling<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<23, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNHardswish` variant](XNodeUnion#variant.XnnHardswish).
            #[inline]
            pub fn xnn_hardswish<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<24, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNLeakyReLU` variant](XNodeUnion#variant.XnnLeakyReLu).
            #[inline]
            pub fn xnn_leaky_re_lu<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<25, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnLeakyReLu>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNMaximum` variant](XNodeUnion#variant.XnnMaximum).
            #[inline]
            pub fn xnn_maximum<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<26, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode2x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNNegate` variant](XNodeUnion#variant.XnnNegate).
            #[inline]
            pub fn xnn_negate<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<27, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNSquare` variant](XNodeUnion#variant.XnnSquare).
            #[inline]
            pub fn xnn_square<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<28, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNELU` variant](XNodeUnion#variant.Xnnelu).
            #[inline]
            pub fn xnnelu<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<29, T>>
            where
                T: ::planus::WriteAsOffset<self::Xnnelu>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNAbs` variant](XNodeUnion#variant.XnnAbs).
            #[inline]
            pub fn xnn_abs<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<30, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNPReLU` variant](XNodeUnion#variant.XnnpReLu).
            #[inline]
            pub fn xnnp_re_lu<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<31, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode2x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNConcatenate2` variant](XNodeUnion#variant.XnnConcatenate2).
            #[inline]
            pub fn xnn_concatenate2<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<32, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnCat>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNConcatenate3` variant](XNodeUnion#variant.XnnConcatenate3).
            #[inline]
            pub fn xnn_concatenate3<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<33, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnCat>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNConcatenate4` variant](XNodeUnion#variant.XnnConcatenate4).
            #[inline]
            pub fn xnn_concatenate4<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<34, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnCat>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNStaticSlice` variant](XNodeUnion#variant.XnnStaticSlice).
            #[inline]
            pub fn xnn_static_slice<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<35, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnStaticSlice>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNScaledDotProductAttention` variant](XNodeUnion#variant.XnnScaledDotProductAttention).
            #[inline]
            pub fn xnn_scaled_dot_product_attention<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<36, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnScaledDotProductAttention>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNBatchMatrixMultiply` variant](XNodeUnion#variant.XnnBatchMatrixMultiply).
            #[inline]
            pub fn xnn_batch_matrix_multiply<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<37, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode2x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNConcatenate5` variant](XNodeUnion#variant.XnnConcatenate5).
            #[inline]
            pub fn xnn_concatenate5<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<38, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnCat>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNConvTranspose2d` variant](XNodeUnion#variant.XnnConvTranspose2d).
            #[inline]
            pub fn xnn_conv_transpose2d<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<39, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNodeConv>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNReciprocalSquareRoot` variant](XNodeUnion#variant.XnnReciprocalSquareRoot).
            #[inline]
            pub fn xnn_reciprocal_square_root<T>(
                self,
                value: T,
            ) -> XNodeUnionBuilder<::planus::Initialized<40, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNLog` variant](XNodeUnion#variant.XnnLog).
            #[inline]
            pub fn xnn_log<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<41, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNGelu` variant](XNodeUnion#variant.XnnGelu).
            #[inline]
            pub fn xnn_gelu<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<42, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNTanh` variant](XNodeUnion#variant.XnnTanh).
            #[inline]
            pub fn xnn_tanh<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<43, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNExp` variant](XNodeUnion#variant.XnnExp).
            #[inline]
            pub fn xnn_exp<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<44, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNSin` variant](XNodeUnion#variant.XnnSin).
            #[inline]
            pub fn xnn_sin<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<45, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNCopy` variant](XNodeUnion#variant.XnnCopy).
            #[inline]
            pub fn xnn_copy<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<46, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNCos` variant](XNodeUnion#variant.XnnCos).
            #[inline]
            pub fn xnn_cos<T>(self, value: T) -> XNodeUnionBuilder<::planus::Initialized<47, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnNode1x1>,
            {
                XNodeUnionBuilder(::planus::Initialized(value))
            }
        }

        impl<const N: u8, T> XNodeUnionBuilder<::planus::Initialized<N, T>> {
            /// Finish writing the builder to get an [UnionOffset](::planus::UnionOffset) to a serialized [XNodeUnion].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion>
            where
                Self: ::planus::WriteAsUnion<XNodeUnion>,
            {
                ::planus::WriteAsUnion::prepare(&self, builder)
            }
        }

        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(1, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnFullyConnected>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(2, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnFullyConnected>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<3, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(3, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<3, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<4, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(4, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<4, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<5, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnStaticTranspose>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(5, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<5, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnStaticTranspose>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<6, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(6, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<6, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<7, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNodeConv>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(7, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<7, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNodeConv>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<8, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(8, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<8, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<9, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnStaticResizeBilinear2D>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(9, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<9, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnStaticResizeBilinear2D>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<10, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnStaticConstantPad>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(10, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<10, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnStaticConstantPad>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<11, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnPooling2D>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(11, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<11, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnPooling2D>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<12, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(12, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<12, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<13, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNodeConv>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(13, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<13, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNodeConv>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<14, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnPooling2D>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(14, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<14, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnPooling2D>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<15, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(15, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<15, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<16, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(16, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<16, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<17, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(17, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<17, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<18, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(18, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<18, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<19, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(19, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<19, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<20, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnStaticReshape>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(20, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<20, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnStaticReshape>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<21, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnArgMaxPooling2d>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(21, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<21, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnArgMaxPooling2d>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<22, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(22, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<22, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<23, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(23, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<23, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<24, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(24, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<24, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<25, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnLeakyReLu>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(25, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<25, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnLeakyReLu>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<26, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(26, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<26, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<27, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(27, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<27, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<28, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(28, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<28, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<29, T>>
        where
            T: ::planus::WriteAsOffset<self::Xnnelu>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(29, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<29, T>>
        where
            T: ::planus::WriteAsOffset<self::Xnnelu>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<30, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(30, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<30, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<31, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(31, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<31, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<32, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnCat>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(32, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<32, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnCat>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<33, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnCat>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(33, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<33, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnCat>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<34, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnCat>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(34, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<34, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnCat>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<35, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnStaticSlice>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(35, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<35, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnStaticSlice>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<36, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnScaledDotProductAttention>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(36, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<36, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnScaledDotProductAttention>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<37, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(37, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<37, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode2x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<38, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnCat>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(38, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<38, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnCat>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<39, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNodeConv>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(39, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<39, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNodeConv>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<40, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(40, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<40, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<41, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(41, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<41, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<42, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(42, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<42, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<43, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(43, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<43, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<44, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(44, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<44, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<45, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(45, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<45, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<46, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(46, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<46, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XNodeUnion> for XNodeUnionBuilder<::planus::Initialized<47, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XNodeUnion> {
                ::planus::UnionOffset::new(47, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XNodeUnion>
            for XNodeUnionBuilder<::planus::Initialized<47, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnNode1x1>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XNodeUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Reference to a deserialized [XNodeUnion].
        #[derive(Copy, Clone, Debug)]
        pub enum XNodeUnionRef<'a> {
            XnnAdd(self::XnnNode2x1Ref<'a>),
            XnnFullyConnected(self::XnnFullyConnectedRef<'a>),
            XnnSoftmax(self::XnnNode1x1Ref<'a>),
            XnnSigmoid(self::XnnNode1x1Ref<'a>),
            XnnStaticTranspose(self::XnnStaticTransposeRef<'a>),
            XnnClamp(self::XnnNode1x1Ref<'a>),
            XnnConv2d(self::XnnNodeConvRef<'a>),
            XnnDiv(self::XnnNode2x1Ref<'a>),
            XnnStaticResizeBilinear2D(self::XnnStaticResizeBilinear2DRef<'a>),
            XnnStaticConstantPad(self::XnnStaticConstantPadRef<'a>),
            XnnAvgPooling2d(self::XnnPooling2DRef<'a>),
            XnnMinimum(self::XnnNode2x1Ref<'a>),
            XnnDepthwiseConv2d(self::XnnNodeConvRef<'a>),
            XnnMaxPooling2d(self::XnnPooling2DRef<'a>),
            XnnMultiply(self::XnnNode2x1Ref<'a>),
            XnnSubtract(self::XnnNode2x1Ref<'a>),
            XnnFloor(self::XnnNode1x1Ref<'a>),
            XnnConvert(self::XnnNode1x1Ref<'a>),
            XnnGlobalAvgPooling2d(self::XnnNode1x1Ref<'a>),
            XnnStaticReshape(self::XnnStaticReshapeRef<'a>),
            XnnArgMaxPooling2d(self::XnnArgMaxPooling2dRef<'a>),
            XnnSquareRoot(self::XnnNode1x1Ref<'a>),
            XnnCeiling(self::XnnNode1x1Ref<'a>),
            XnnHardswish(self::XnnNode1x1Ref<'a>),
            XnnLeakyReLu(self::XnnLeakyReLuRef<'a>),
            XnnMaximum(self::XnnNode2x1Ref<'a>),
            XnnNegate(self::XnnNode1x1Ref<'a>),
            XnnSquare(self::XnnNode1x1Ref<'a>),
            Xnnelu(self::XnneluRef<'a>),
            XnnAbs(self::XnnNode1x1Ref<'a>),
            XnnpReLu(self::XnnNode2x1Ref<'a>),
            XnnConcatenate2(self::XnnCatRef<'a>),
            XnnConcatenate3(self::XnnCatRef<'a>),
            XnnConcatenate4(self::XnnCatRef<'a>),
            XnnStaticSlice(self::XnnStaticSliceRef<'a>),
            XnnScaledDotProductAttention(self::XnnScaledDotProductAttentionRef<'a>),
            XnnBatchMatrixMultiply(self::XnnNode2x1Ref<'a>),
            XnnConcatenate5(self::XnnCatRef<'a>),
            XnnConvTranspose2d(self::XnnNodeConvRef<'a>),
            XnnReciprocalSquareRoot(self::XnnNode1x1Ref<'a>),
            XnnLog(self::XnnNode1x1Ref<'a>),
            XnnGelu(self::XnnNode1x1Ref<'a>),
            XnnTanh(self::XnnNode1x1Ref<'a>),
            XnnExp(self::XnnNode1x1Ref<'a>),
            XnnSin(self::XnnNode1x1Ref<'a>),
            XnnCopy(self::XnnNode1x1Ref<'a>),
            XnnCos(self::XnnNode1x1Ref<'a>),
        }

        impl<'a> ::core::convert::TryFrom<XNodeUnionRef<'a>> for XNodeUnion {
            type Error = ::planus::Error;

            fn try_from(value: XNodeUnionRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(match value {
                    XNodeUnionRef::XnnAdd(value) => Self::XnnAdd(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    XNodeUnionRef::XnnFullyConnected(value) => {
                        Self::XnnFullyConnected(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnSoftmax(value) => {
                        Self::XnnSoftmax(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnSigmoid(value) => {
                        Self::XnnSigmoid(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnStaticTranspose(value) => {
                        Self::XnnStaticTranspose(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnClamp(value) => {
                        Self::XnnClamp(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnConv2d(value) => {
                        Self::XnnConv2d(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnDiv(value) => Self::XnnDiv(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    XNodeUnionRef::XnnStaticResizeBilinear2D(value) => {
                        Self::XnnStaticResizeBilinear2D(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnStaticConstantPad(value) => {
                        Self::XnnStaticConstantPad(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnAvgPooling2d(value) => {
                        Self::XnnAvgPooling2d(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnMinimum(value) => {
                        Self::XnnMinimum(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnDepthwiseConv2d(value) => {
                        Self::XnnDepthwiseConv2d(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnMaxPooling2d(value) => {
                        Self::XnnMaxPooling2d(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnMultiply(value) => {
                        Self::XnnMultiply(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnSubtract(value) => {
                        Self::XnnSubtract(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnFloor(value) => {
                        Self::XnnFloor(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnConvert(value) => {
                        Self::XnnConvert(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnGlobalAvgPooling2d(value) => {
                        Self::XnnGlobalAvgPooling2d(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnStaticReshape(value) => {
                        Self::XnnStaticReshape(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnArgMaxPooling2d(value) => {
                        Self::XnnArgMaxPooling2d(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnSquareRoot(value) => {
                        Self::XnnSquareRoot(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnCeiling(value) => {
                        Self::XnnCeiling(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnHardswish(value) => {
                        Self::XnnHardswish(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnLeakyReLu(value) => {
                        Self::XnnLeakyReLu(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnMaximum(value) => {
                        Self::XnnMaximum(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnNegate(value) => {
                        Self::XnnNegate(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnSquare(value) => {
                        Self::XnnSquare(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::Xnnelu(value) => Self::Xnnelu(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    XNodeUnionRef::XnnAbs(value) => Self::XnnAbs(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    XNodeUnionRef::XnnpReLu(value) => {
                        Self::XnnpReLu(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnConcatenate2(value) => {
                        Self::XnnConcatenate2(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnConcatenate3(value) => {
                        Self::XnnConcatenate3(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnConcatenate4(value) => {
                        Self::XnnConcatenate4(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnStaticSlice(value) => {
                        Self::XnnStaticSlice(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnScaledDotProductAttention(value) => {
                        Self::XnnScaledDotProductAttention(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnBatchMatrixMultiply(value) => {
                        Self::XnnBatchMatrixMultiply(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnConcatenate5(value) => {
                        Self::XnnConcatenate5(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnConvTranspose2d(value) => {
                        Self::XnnConvTranspose2d(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnReciprocalSquareRoot(value) => {
                        Self::XnnReciprocalSquareRoot(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnLog(value) => Self::XnnLog(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    XNodeUnionRef::XnnGelu(value) => {
                        Self::XnnGelu(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnTanh(value) => {
                        Self::XnnTanh(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnExp(value) => Self::XnnExp(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    XNodeUnionRef::XnnSin(value) => Self::XnnSin(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),

                    XNodeUnionRef::XnnCopy(value) => {
                        Self::XnnCopy(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XNodeUnionRef::XnnCos(value) => Self::XnnCos(::planus::alloc::boxed::Box::new(
                        ::core::convert::TryFrom::try_from(value)?,
                    )),
                })
            }
        }

        impl<'a> ::planus::TableReadUnion<'a> for XNodeUnionRef<'a> {
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                tag: u8,
                field_offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                match tag {
                    1 => ::core::result::Result::Ok(Self::XnnAdd(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    2 => ::core::result::Result::Ok(Self::XnnFullyConnected(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    3 => ::core::result::Result::Ok(Self::XnnSoftmax(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    4 => ::core::result::Result::Ok(Self::XnnSigmoid(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    5 => ::core::result::Result::Ok(Self::XnnStaticTranspose(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    6 => ::core::result::Result::Ok(Self::XnnClamp(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    7 => ::core::result::Result::Ok(Self::XnnConv2d(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    8 => ::core::result::Result::Ok(Self::XnnDiv(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    9 => ::core::result::Result::Ok(Self::XnnStaticResizeBilinear2D(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    10 => ::core::result::Result::Ok(Self::XnnStaticConstantPad(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    11 => ::core::result::Result::Ok(Self::XnnAvgPooling2d(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    12 => ::core::result::Result::Ok(Self::XnnMinimum(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    13 => ::core::result::Result::Ok(Self::XnnDepthwiseConv2d(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    14 => ::core::result::Result::Ok(Self::XnnMaxPooling2d(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    15 => ::core::result::Result::Ok(Self::XnnMultiply(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    16 => ::core::result::Result::Ok(Self::XnnSubtract(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    17 => ::core::result::Result::Ok(Self::XnnFloor(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    18 => ::core::result::Result::Ok(Self::XnnConvert(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    19 => ::core::result::Result::Ok(Self::XnnGlobalAvgPooling2d(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    20 => ::core::result::Result::Ok(Self::XnnStaticReshape(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    21 => ::core::result::Result::Ok(Self::XnnArgMaxPooling2d(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    22 => ::core::result::Result::Ok(Self::XnnSquareRoot(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    23 => ::core::result::Result::Ok(Self::XnnCeiling(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    24 => ::core::result::Result::Ok(Self::XnnHardswish(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    25 => ::core::result::Result::Ok(Self::XnnLeakyReLu(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    26 => ::core::result::Result::Ok(Self::XnnMaximum(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    27 => ::core::result::Result::Ok(Self::XnnNegate(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    28 => ::core::result::Result::Ok(Self::XnnSquare(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    29 => ::core::result::Result::Ok(Self::Xnnelu(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    30 => ::core::result::Result::Ok(Self::XnnAbs(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    31 => ::core::result::Result::Ok(Self::XnnpReLu(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    32 => ::core::result::Result::Ok(Self::XnnConcatenate2(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    33 => ::core::result::Result::Ok(Self::XnnConcatenate3(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    34 => ::core::result::Result::Ok(Self::XnnConcatenate4(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    35 => ::core::result::Result::Ok(Self::XnnStaticSlice(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    36 => ::core::result::Result::Ok(Self::XnnScaledDotProductAttention(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    37 => ::core::result::Result::Ok(Self::XnnBatchMatrixMultiply(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    38 => ::core::result::Result::Ok(Self::XnnConcatenate5(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    39 => ::core::result::Result::Ok(Self::XnnConvTranspose2d(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    40 => ::core::result::Result::Ok(Self::XnnReciprocalSquareRoot(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    41 => ::core::result::Result::Ok(Self::XnnLog(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    42 => ::core::result::Result::Ok(Self::XnnGelu(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    43 => ::core::result::Result::Ok(Self::XnnTanh(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    44 => ::core::result::Result::Ok(Self::XnnExp(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    45 => ::core::result::Result::Ok(Self::XnnSin(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    46 => ::core::result::Result::Ok(Self::XnnCopy(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    47 => ::core::result::Result::Ok(Self::XnnCos(
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

        impl<'a> ::planus::VectorReadUnion<'a> for XNodeUnionRef<'a> {
            const VECTOR_NAME: &'static str = "[XNodeUnionRef]";
        }

        /// The union `XValueUnion` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Union `XValueUnion` in the file `schema/xnnpack.fbs:162`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub enum XValueUnion {
            /// The variant of type `XNNTensorValue` in the union `XValueUnion`
            XnnTensorValue(::planus::alloc::boxed::Box<self::XnnTensorValue>),

            /// The variant of type `XNNQuantizedTensorValue` in the union `XValueUnion`
            XnnQuantizedTensorValue(::planus::alloc::boxed::Box<self::XnnQuantizedTensorValue>),
        }

        impl XValueUnion {
            /// Creates a [XValueUnionBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XValueUnionBuilder<::planus::Uninitialized> {
                XValueUnionBuilder(::planus::Uninitialized)
            }

            #[inline]
            pub fn create_xnn_tensor_value(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnTensorValue>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(1, value.prepare(builder).downcast())
            }

            #[inline]
            pub fn create_xnn_quantized_tensor_value(
                builder: &mut ::planus::Builder,
                value: impl ::planus::WriteAsOffset<self::XnnQuantizedTensorValue>,
            ) -> ::planus::UnionOffset<Self> {
                ::planus::UnionOffset::new(2, value.prepare(builder).downcast())
            }
        }

        impl ::planus::WriteAsUnion<XValueUnion> for XValueUnion {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::UnionOffset<Self> {
                match self {
                    Self::XnnTensorValue(value) => Self::create_xnn_tensor_value(builder, value),
                    Self::XnnQuantizedTensorValue(value) => {
                        Self::create_xnn_quantized_tensor_value(builder, value)
                    }
                }
            }
        }

        impl ::planus::WriteAsOptionalUnion<XValueUnion> for XValueUnion {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<Self>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Builder for serializing an instance of the [XValueUnion] type.
        ///
        /// Can be created using the [XValueUnion::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XValueUnionBuilder<T>(T);

        impl XValueUnionBuilder<::planus::Uninitialized> {
            /// Creates an instance of the [`XNNTensorValue` variant](XValueUnion#variant.XnnTensorValue).
            #[inline]
            pub fn xnn_tensor_value<T>(
                self,
                value: T,
            ) -> XValueUnionBuilder<::planus::Initialized<1, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnTensorValue>,
            {
                XValueUnionBuilder(::planus::Initialized(value))
            }

            /// Creates an instance of the [`XNNQuantizedTensorValue` variant](XValueUnion#variant.XnnQuantizedTensorValue).
            #[inline]
            pub fn xnn_quantized_tensor_value<T>(
                self,
                value: T,
            ) -> XValueUnionBuilder<::planus::Initialized<2, T>>
            where
                T: ::planus::WriteAsOffset<self::XnnQuantizedTensorValue>,
            {
                XValueUnionBuilder(::planus::Initialized(value))
            }
        }

        impl<const N: u8, T> XValueUnionBuilder<::planus::Initialized<N, T>> {
            /// Finish writing the builder to get an [UnionOffset](::planus::UnionOffset) to a serialized [XValueUnion].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XValueUnion>
            where
                Self: ::planus::WriteAsUnion<XValueUnion>,
            {
                ::planus::WriteAsUnion::prepare(&self, builder)
            }
        }

        impl<T> ::planus::WriteAsUnion<XValueUnion> for XValueUnionBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnTensorValue>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XValueUnion> {
                ::planus::UnionOffset::new(1, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XValueUnion>
            for XValueUnionBuilder<::planus::Initialized<1, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnTensorValue>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XValueUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }
        impl<T> ::planus::WriteAsUnion<XValueUnion> for XValueUnionBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnQuantizedTensorValue>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::UnionOffset<XValueUnion> {
                ::planus::UnionOffset::new(2, (self.0).0.prepare(builder).downcast())
            }
        }

        impl<T> ::planus::WriteAsOptionalUnion<XValueUnion>
            for XValueUnionBuilder<::planus::Initialized<2, T>>
        where
            T: ::planus::WriteAsOffset<self::XnnQuantizedTensorValue>,
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::UnionOffset<XValueUnion>> {
                ::core::option::Option::Some(::planus::WriteAsUnion::prepare(self, builder))
            }
        }

        /// Reference to a deserialized [XValueUnion].
        #[derive(Copy, Clone, Debug)]
        pub enum XValueUnionRef<'a> {
            XnnTensorValue(self::XnnTensorValueRef<'a>),
            XnnQuantizedTensorValue(self::XnnQuantizedTensorValueRef<'a>),
        }

        impl<'a> ::core::convert::TryFrom<XValueUnionRef<'a>> for XValueUnion {
            type Error = ::planus::Error;

            fn try_from(value: XValueUnionRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(match value {
                    XValueUnionRef::XnnTensorValue(value) => {
                        Self::XnnTensorValue(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }

                    XValueUnionRef::XnnQuantizedTensorValue(value) => {
                        Self::XnnQuantizedTensorValue(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryFrom::try_from(value)?,
                        ))
                    }
                })
            }
        }

        impl<'a> ::planus::TableReadUnion<'a> for XValueUnionRef<'a> {
            fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                tag: u8,
                field_offset: usize,
            ) -> ::core::result::Result<Self, ::planus::errors::ErrorKind> {
                match tag {
                    1 => ::core::result::Result::Ok(Self::XnnTensorValue(
                        ::planus::TableRead::from_buffer(buffer, field_offset)?,
                    )),
                    2 => ::core::result::Result::Ok(Self::XnnQuantizedTensorValue(
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

        impl<'a> ::planus::VectorReadUnion<'a> for XValueUnionRef<'a> {
            const VECTOR_NAME: &'static str = "[XValueUnionRef]";
        }

        /// The table `OutputMinMax` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `OutputMinMax` in the file `schema/xnnpack.fbs:168`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct OutputMinMax {
            /// The field `output_min` in the table `OutputMinMax`
            pub output_min: f32,
            /// The field `output_max` in the table `OutputMinMax`
            pub output_max: f32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for OutputMinMax {
            fn default() -> Self {
                Self {
                    output_min: 0.0,
                    output_max: 0.0,
                }
            }
        }

        impl OutputMinMax {
            /// Creates a [OutputMinMaxBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> OutputMinMaxBuilder<()> {
                OutputMinMaxBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_output_min: impl ::planus::WriteAsDefault<f32, f32>,
                field_output_max: impl ::planus::WriteAsDefault<f32, f32>,
            ) -> ::planus::Offset<Self> {
                let prepared_output_min = field_output_min.prepare(builder, &0.0);
                let prepared_output_max = field_output_max.prepare(builder, &0.0);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_output_min.is_some() {
                    table_writer.write_entry::<f32>(0);
                }
                if prepared_output_max.is_some() {
                    table_writer.write_entry::<f32>(1);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_output_min) =
                            prepared_output_min
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_min);
                        }
                        if let ::core::option::Option::Some(prepared_output_max) =
                            prepared_output_max
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_max);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<OutputMinMax>> for OutputMinMax {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<OutputMinMax> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<OutputMinMax>> for OutputMinMax {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<OutputMinMax>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<OutputMinMax> for OutputMinMax {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<OutputMinMax> {
                OutputMinMax::create(builder, self.output_min, self.output_max)
            }
        }

        /// Builder for serializing an instance of the [OutputMinMax] type.
        ///
        /// Can be created using the [OutputMinMax::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct OutputMinMaxBuilder<State>(State);

        impl OutputMinMaxBuilder<()> {
            /// Setter for the [`output_min` field](OutputMinMax#structfield.output_min).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_min<T0>(self, value: T0) -> OutputMinMaxBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<f32, f32>,
            {
                OutputMinMaxBuilder((value,))
            }

            /// Sets the [`output_min` field](OutputMinMax#structfield.output_min) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_min_as_default(self) -> OutputMinMaxBuilder<(::planus::DefaultValue,)> {
                self.output_min(::planus::DefaultValue)
            }
        }

        impl<T0> OutputMinMaxBuilder<(T0,)> {
            /// Setter for the [`output_max` field](OutputMinMax#structfield.output_max).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_max<T1>(self, value: T1) -> OutputMinMaxBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<f32, f32>,
            {
                let (v0,) = self.0;
                OutputMinMaxBuilder((v0, value))
            }

            /// Sets the [`output_max` field](OutputMinMax#structfield.output_max) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_max_as_default(
                self,
            ) -> OutputMinMaxBuilder<(T0, ::planus::DefaultValue)> {
                self.output_max(::planus::DefaultValue)
            }
        }

        impl<T0, T1> OutputMinMaxBuilder<(T0, T1)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [OutputMinMax].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<OutputMinMax>
            where
                Self: ::planus::WriteAsOffset<OutputMinMax>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<f32, f32>, T1: ::planus::WriteAsDefault<f32, f32>>
            ::planus::WriteAs<::planus::Offset<OutputMinMax>> for OutputMinMaxBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<OutputMinMax>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<OutputMinMax> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsDefault<f32, f32>, T1: ::planus::WriteAsDefault<f32, f32>>
            ::planus::WriteAsOptional<::planus::Offset<OutputMinMax>>
            for OutputMinMaxBuilder<(T0, T1)>
        {
            type Prepared = ::planus::Offset<OutputMinMax>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<OutputMinMax>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsDefault<f32, f32>, T1: ::planus::WriteAsDefault<f32, f32>>
            ::planus::WriteAsOffset<OutputMinMax> for OutputMinMaxBuilder<(T0, T1)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<OutputMinMax> {
                let (v0, v1) = &self.0;
                OutputMinMax::create(builder, v0, v1)
            }
        }

        /// Reference to a deserialized [OutputMinMax].
        #[derive(Copy, Clone)]
        pub struct OutputMinMaxRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> OutputMinMaxRef<'a> {
            /// Getter for the [`output_min` field](OutputMinMax#structfield.output_min).
            #[inline]
            pub fn output_min(&self) -> ::planus::Result<f32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "OutputMinMax", "output_min")?
                        .unwrap_or(0.0),
                )
            }

            /// Getter for the [`output_max` field](OutputMinMax#structfield.output_max).
            #[inline]
            pub fn output_max(&self) -> ::planus::Result<f32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "OutputMinMax", "output_max")?
                        .unwrap_or(0.0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for OutputMinMaxRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("OutputMinMaxRef");
                f.field("output_min", &self.output_min());
                f.field("output_max", &self.output_max());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<OutputMinMaxRef<'a>> for OutputMinMax {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: OutputMinMaxRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    output_min: ::core::convert::TryInto::try_into(value.output_min()?)?,
                    output_max: ::core::convert::TryInto::try_into(value.output_max()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for OutputMinMaxRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for OutputMinMaxRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[OutputMinMaxRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<OutputMinMax>> for OutputMinMax {
            type Value = ::planus::Offset<OutputMinMax>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<OutputMinMax>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for OutputMinMaxRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[OutputMinMaxRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNode` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNode` in the file `schema/xnnpack.fbs:173`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct XNode {
            /// The field `xnode_union` in the table `XNode`
            pub xnode_union: ::core::option::Option<self::XNodeUnion>,
            /// The field `debug_handle` in the table `XNode`
            pub debug_handle: u32,
            /// The field `output_min_max` in the table `XNode`
            pub output_min_max:
                ::core::option::Option<::planus::alloc::boxed::Box<self::OutputMinMax>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XNode {
            fn default() -> Self {
                Self {
                    xnode_union: ::core::default::Default::default(),
                    debug_handle: 0,
                    output_min_max: ::core::default::Default::default(),
                }
            }
        }

        impl XNode {
            /// Creates a [XNodeBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XNodeBuilder<()> {
                XNodeBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_xnode_union: impl ::planus::WriteAsOptionalUnion<self::XNodeUnion>,
                field_debug_handle: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_min_max: impl ::planus::WriteAsOptional<
                    ::planus::Offset<self::OutputMinMax>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_xnode_union = field_xnode_union.prepare(builder);
                let prepared_debug_handle = field_debug_handle.prepare(builder, &0);
                let prepared_output_min_max = field_output_min_max.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<12> =
                    ::core::default::Default::default();
                if prepared_xnode_union.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::XNodeUnion>>(1);
                }
                if prepared_debug_handle.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_output_min_max.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::OutputMinMax>>(3);
                }
                if prepared_xnode_union.is_some() {
                    table_writer.write_entry::<u8>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_xnode_union) =
                            prepared_xnode_union
                        {
                            object_writer.write::<_, _, 4>(&prepared_xnode_union.offset());
                        }
                        if let ::core::option::Option::Some(prepared_debug_handle) =
                            prepared_debug_handle
                        {
                            object_writer.write::<_, _, 4>(&prepared_debug_handle);
                        }
                        if let ::core::option::Option::Some(prepared_output_min_max) =
                            prepared_output_min_max
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_min_max);
                        }
                        if let ::core::option::Option::Some(prepared_xnode_union) =
                            prepared_xnode_union
                        {
                            object_writer.write::<_, _, 1>(&prepared_xnode_union.tag());
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XNode>> for XNode {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XNode> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XNode>> for XNode {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XNode>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XNode> for XNode {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XNode> {
                XNode::create(
                    builder,
                    &self.xnode_union,
                    self.debug_handle,
                    &self.output_min_max,
                )
            }
        }

        /// Builder for serializing an instance of the [XNode] type.
        ///
        /// Can be created using the [XNode::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XNodeBuilder<State>(State);

        impl XNodeBuilder<()> {
            /// Setter for the [`xnode_union` field](XNode#structfield.xnode_union).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn xnode_union<T0>(self, value: T0) -> XNodeBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptionalUnion<self::XNodeUnion>,
            {
                XNodeBuilder((value,))
            }

            /// Sets the [`xnode_union` field](XNode#structfield.xnode_union) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn xnode_union_as_null(self) -> XNodeBuilder<((),)> {
                self.xnode_union(())
            }
        }

        impl<T0> XNodeBuilder<(T0,)> {
            /// Setter for the [`debug_handle` field](XNode#structfield.debug_handle).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn debug_handle<T1>(self, value: T1) -> XNodeBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XNodeBuilder((v0, value))
            }

            /// Sets the [`debug_handle` field](XNode#structfield.debug_handle) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn debug_handle_as_default(self) -> XNodeBuilder<(T0, ::planus::DefaultValue)> {
                self.debug_handle(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XNodeBuilder<(T0, T1)> {
            /// Setter for the [`output_min_max` field](XNode#structfield.output_min_max).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_min_max<T2>(self, value: T2) -> XNodeBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<self::OutputMinMax>>,
            {
                let (v0, v1) = self.0;
                XNodeBuilder((v0, v1, value))
            }

            /// Sets the [`output_min_max` field](XNode#structfield.output_min_max) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_min_max_as_null(self) -> XNodeBuilder<(T0, T1, ())> {
                self.output_min_max(())
            }
        }

        impl<T0, T1, T2> XNodeBuilder<(T0, T1, T2)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XNode].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XNode>
            where
                Self: ::planus::WriteAsOffset<XNode>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptionalUnion<self::XNodeUnion>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<self::OutputMinMax>>,
            > ::planus::WriteAs<::planus::Offset<XNode>> for XNodeBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<XNode>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XNode> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptionalUnion<self::XNodeUnion>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<self::OutputMinMax>>,
            > ::planus::WriteAsOptional<::planus::Offset<XNode>> for XNodeBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<XNode>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XNode>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptionalUnion<self::XNodeUnion>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsOptional<::planus::Offset<self::OutputMinMax>>,
            > ::planus::WriteAsOffset<XNode> for XNodeBuilder<(T0, T1, T2)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XNode> {
                let (v0, v1, v2) = &self.0;
                XNode::create(builder, v0, v1, v2)
            }
        }

        /// Reference to a deserialized [XNode].
        #[derive(Copy, Clone)]
        pub struct XNodeRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XNodeRef<'a> {
            /// Getter for the [`xnode_union` field](XNode#structfield.xnode_union).
            #[inline]
            pub fn xnode_union(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::XNodeUnionRef<'a>>> {
                self.0.access_union(0, "XNode", "xnode_union")
            }

            /// Getter for the [`debug_handle` field](XNode#structfield.debug_handle).
            #[inline]
            pub fn debug_handle(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(2, "XNode", "debug_handle")?.unwrap_or(0))
            }

            /// Getter for the [`output_min_max` field](XNode#structfield.output_min_max).
            #[inline]
            pub fn output_min_max(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::OutputMinMaxRef<'a>>> {
                self.0.access(3, "XNode", "output_min_max")
            }
        }

        impl<'a> ::core::fmt::Debug for XNodeRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XNodeRef");
                if let ::core::option::Option::Some(field_xnode_union) =
                    self.xnode_union().transpose()
                {
                    f.field("xnode_union", &field_xnode_union);
                }
                f.field("debug_handle", &self.debug_handle());
                if let ::core::option::Option::Some(field_output_min_max) =
                    self.output_min_max().transpose()
                {
                    f.field("output_min_max", &field_output_min_max);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XNodeRef<'a>> for XNode {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XNodeRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    xnode_union: if let ::core::option::Option::Some(xnode_union) =
                        value.xnode_union()?
                    {
                        ::core::option::Option::Some(::core::convert::TryInto::try_into(
                            xnode_union,
                        )?)
                    } else {
                        ::core::option::Option::None
                    },
                    debug_handle: ::core::convert::TryInto::try_into(value.debug_handle()?)?,
                    output_min_max: if let ::core::option::Option::Some(output_min_max) =
                        value.output_min_max()?
                    {
                        ::core::option::Option::Some(::planus::alloc::boxed::Box::new(
                            ::core::convert::TryInto::try_into(output_min_max)?,
                        ))
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XNodeRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XNodeRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[XNodeRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XNode>> for XNode {
            type Value = ::planus::Offset<XNode>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XNode>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XNodeRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XNodeRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XValue` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XValue` in the file `schema/xnnpack.fbs:180`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct XValue {
            /// The field `xvalue_union` in the table `XValue`
            pub xvalue_union: ::core::option::Option<self::XValueUnion>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XValue {
            fn default() -> Self {
                Self {
                    xvalue_union: ::core::default::Default::default(),
                }
            }
        }

        impl XValue {
            /// Creates a [XValueBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XValueBuilder<()> {
                XValueBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_xvalue_union: impl ::planus::WriteAsOptionalUnion<self::XValueUnion>,
            ) -> ::planus::Offset<Self> {
                let prepared_xvalue_union = field_xvalue_union.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<8> =
                    ::core::default::Default::default();
                if prepared_xvalue_union.is_some() {
                    table_writer.write_entry::<::planus::Offset<self::XValueUnion>>(1);
                }
                if prepared_xvalue_union.is_some() {
                    table_writer.write_entry::<u8>(0);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_xvalue_union) =
                            prepared_xvalue_union
                        {
                            object_writer.write::<_, _, 4>(&prepared_xvalue_union.offset());
                        }
                        if let ::core::option::Option::Some(prepared_xvalue_union) =
                            prepared_xvalue_union
                        {
                            object_writer.write::<_, _, 1>(&prepared_xvalue_union.tag());
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XValue>> for XValue {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XValue> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XValue>> for XValue {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XValue>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XValue> for XValue {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XValue> {
                XValue::create(builder, &self.xvalue_union)
            }
        }

        /// Builder for serializing an instance of the [XValue] type.
        ///
        /// Can be created using the [XValue::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XValueBuilder<State>(State);

        impl XValueBuilder<()> {
            /// Setter for the [`xvalue_union` field](XValue#structfield.xvalue_union).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn xvalue_union<T0>(self, value: T0) -> XValueBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptionalUnion<self::XValueUnion>,
            {
                XValueBuilder((value,))
            }

            /// Sets the [`xvalue_union` field](XValue#structfield.xvalue_union) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn xvalue_union_as_null(self) -> XValueBuilder<((),)> {
                self.xvalue_union(())
            }
        }

        impl<T0> XValueBuilder<(T0,)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XValue].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XValue>
            where
                Self: ::planus::WriteAsOffset<XValue>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::XValueUnion>>
            ::planus::WriteAs<::planus::Offset<XValue>> for XValueBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<XValue>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XValue> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::XValueUnion>>
            ::planus::WriteAsOptional<::planus::Offset<XValue>> for XValueBuilder<(T0,)>
        {
            type Prepared = ::planus::Offset<XValue>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XValue>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<T0: ::planus::WriteAsOptionalUnion<self::XValueUnion>> ::planus::WriteAsOffset<XValue>
            for XValueBuilder<(T0,)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XValue> {
                let (v0,) = &self.0;
                XValue::create(builder, v0)
            }
        }

        /// Reference to a deserialized [XValue].
        #[derive(Copy, Clone)]
        pub struct XValueRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XValueRef<'a> {
            /// Getter for the [`xvalue_union` field](XValue#structfield.xvalue_union).
            #[inline]
            pub fn xvalue_union(
                &self,
            ) -> ::planus::Result<::core::option::Option<self::XValueUnionRef<'a>>> {
                self.0.access_union(0, "XValue", "xvalue_union")
            }
        }

        impl<'a> ::core::fmt::Debug for XValueRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XValueRef");
                if let ::core::option::Option::Some(field_xvalue_union) =
                    self.xvalue_union().transpose()
                {
                    f.field("xvalue_union", &field_xvalue_union);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XValueRef<'a>> for XValue {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XValueRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    xvalue_union: if let ::core::option::Option::Some(xvalue_union) =
                        value.xvalue_union()?
                    {
                        ::core::option::Option::Some(::core::convert::TryInto::try_into(
                            xvalue_union,
                        )?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XValueRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XValueRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[XValueRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XValue>> for XValue {
            type Value = ::planus::Offset<XValue>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XValue>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XValueRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XValueRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNStaticTranspose` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNStaticTranspose` in the file `schema/xnnpack.fbs:184`
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
        pub struct XnnStaticTranspose {
            /// The field `num_dims` in the table `XNNStaticTranspose`
            pub num_dims: u32,
            /// The field `perm` in the table `XNNStaticTranspose`
            pub perm: ::core::option::Option<::planus::alloc::vec::Vec<u32>>,
            /// The field `input_id` in the table `XNNStaticTranspose`
            pub input_id: u32,
            /// The field `output_id` in the table `XNNStaticTranspose`
            pub output_id: u32,
            /// The field `flags` in the table `XNNStaticTranspose`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnStaticTranspose {
            fn default() -> Self {
                Self {
                    num_dims: 0,
                    perm: ::core::default::Default::default(),
                    input_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnStaticTranspose {
            /// Creates a [XnnStaticTransposeBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnStaticTransposeBuilder<()> {
                XnnStaticTransposeBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_num_dims: impl ::planus::WriteAsDefault<u32, u32>,
                field_perm: impl ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                field_input_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_num_dims = field_num_dims.prepare(builder, &0);
                let prepared_perm = field_perm.prepare(builder);
                let prepared_input_id = field_input_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<14> =
                    ::core::default::Default::default();
                if prepared_num_dims.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_perm.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u32]>>(1);
                }
                if prepared_input_id.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(4);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_num_dims) = prepared_num_dims {
                            object_writer.write::<_, _, 4>(&prepared_num_dims);
                        }
                        if let ::core::option::Option::Some(prepared_perm) = prepared_perm {
                            object_writer.write::<_, _, 4>(&prepared_perm);
                        }
                        if let ::core::option::Option::Some(prepared_input_id) = prepared_input_id {
                            object_writer.write::<_, _, 4>(&prepared_input_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnStaticTranspose>> for XnnStaticTranspose {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticTranspose> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnStaticTranspose>> for XnnStaticTranspose {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnStaticTranspose>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnStaticTranspose> for XnnStaticTranspose {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticTranspose> {
                XnnStaticTranspose::create(
                    builder,
                    self.num_dims,
                    &self.perm,
                    self.input_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnStaticTranspose] type.
        ///
        /// Can be created using the [XnnStaticTranspose::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnStaticTransposeBuilder<State>(State);

        impl XnnStaticTransposeBuilder<()> {
            /// Setter for the [`num_dims` field](XnnStaticTranspose#structfield.num_dims).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_dims<T0>(self, value: T0) -> XnnStaticTransposeBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnStaticTransposeBuilder((value,))
            }

            /// Sets the [`num_dims` field](XnnStaticTranspose#structfield.num_dims) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_dims_as_default(
                self,
            ) -> XnnStaticTransposeBuilder<(::planus::DefaultValue,)> {
                self.num_dims(::planus::DefaultValue)
            }
        }

        impl<T0> XnnStaticTransposeBuilder<(T0,)> {
            /// Setter for the [`perm` field](XnnStaticTranspose#structfield.perm).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn perm<T1>(self, value: T1) -> XnnStaticTransposeBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
            {
                let (v0,) = self.0;
                XnnStaticTransposeBuilder((v0, value))
            }

            /// Sets the [`perm` field](XnnStaticTranspose#structfield.perm) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn perm_as_null(self) -> XnnStaticTransposeBuilder<(T0, ())> {
                self.perm(())
            }
        }

        impl<T0, T1> XnnStaticTransposeBuilder<(T0, T1)> {
            /// Setter for the [`input_id` field](XnnStaticTranspose#structfield.input_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id<T2>(self, value: T2) -> XnnStaticTransposeBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnStaticTransposeBuilder((v0, v1, value))
            }

            /// Sets the [`input_id` field](XnnStaticTranspose#structfield.input_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id_as_default(
                self,
            ) -> XnnStaticTransposeBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.input_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnStaticTransposeBuilder<(T0, T1, T2)> {
            /// Setter for the [`output_id` field](XnnStaticTranspose#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T3>(self, value: T3) -> XnnStaticTransposeBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnStaticTransposeBuilder((v0, v1, v2, value))
            }

            /// Sets the [`output_id` field](XnnStaticTranspose#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnStaticTransposeBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnStaticTransposeBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`flags` field](XnnStaticTranspose#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T4>(self, value: T4) -> XnnStaticTransposeBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnStaticTransposeBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`flags` field](XnnStaticTranspose#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnStaticTransposeBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnStaticTransposeBuilder<(T0, T1, T2, T3, T4)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnStaticTranspose].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticTranspose>
            where
                Self: ::planus::WriteAsOffset<XnnStaticTranspose>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnStaticTranspose>>
            for XnnStaticTransposeBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<XnnStaticTranspose>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticTranspose> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnStaticTranspose>>
            for XnnStaticTransposeBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<XnnStaticTranspose>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnStaticTranspose>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnStaticTranspose>
            for XnnStaticTransposeBuilder<(T0, T1, T2, T3, T4)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticTranspose> {
                let (v0, v1, v2, v3, v4) = &self.0;
                XnnStaticTranspose::create(builder, v0, v1, v2, v3, v4)
            }
        }

        /// Reference to a deserialized [XnnStaticTranspose].
        #[derive(Copy, Clone)]
        pub struct XnnStaticTransposeRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnStaticTransposeRef<'a> {
            /// Getter for the [`num_dims` field](XnnStaticTranspose#structfield.num_dims).
            #[inline]
            pub fn num_dims(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "XnnStaticTranspose", "num_dims")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`perm` field](XnnStaticTranspose#structfield.perm).
            #[inline]
            pub fn perm(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u32>>> {
                self.0.access(1, "XnnStaticTranspose", "perm")
            }

            /// Getter for the [`input_id` field](XnnStaticTranspose#structfield.input_id).
            #[inline]
            pub fn input_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "XnnStaticTranspose", "input_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnStaticTranspose#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "XnnStaticTranspose", "output_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnStaticTranspose#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "XnnStaticTranspose", "flags")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for XnnStaticTransposeRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnStaticTransposeRef");
                f.field("num_dims", &self.num_dims());
                if let ::core::option::Option::Some(field_perm) = self.perm().transpose() {
                    f.field("perm", &field_perm);
                }
                f.field("input_id", &self.input_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnStaticTransposeRef<'a>> for XnnStaticTranspose {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnStaticTransposeRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    num_dims: ::core::convert::TryInto::try_into(value.num_dims()?)?,
                    perm: if let ::core::option::Option::Some(perm) = value.perm()? {
                        ::core::option::Option::Some(perm.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    input_id: ::core::convert::TryInto::try_into(value.input_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnStaticTransposeRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnStaticTransposeRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnStaticTransposeRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnStaticTranspose>> for XnnStaticTranspose {
            type Value = ::planus::Offset<XnnStaticTranspose>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnStaticTranspose>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnStaticTransposeRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnStaticTransposeRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNStaticResizeBilinear2D` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNStaticResizeBilinear2D` in the file `schema/xnnpack.fbs:192`
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
        pub struct XnnStaticResizeBilinear2D {
            /// The field `new_height` in the table `XNNStaticResizeBilinear2D`
            pub new_height: u32,
            /// The field `new_width` in the table `XNNStaticResizeBilinear2D`
            pub new_width: u32,
            /// The field `input_id` in the table `XNNStaticResizeBilinear2D`
            pub input_id: u32,
            /// The field `output_id` in the table `XNNStaticResizeBilinear2D`
            pub output_id: u32,
            /// The field `flags` in the table `XNNStaticResizeBilinear2D`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnStaticResizeBilinear2D {
            fn default() -> Self {
                Self {
                    new_height: 0,
                    new_width: 0,
                    input_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnStaticResizeBilinear2D {
            /// Creates a [XnnStaticResizeBilinear2DBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnStaticResizeBilinear2DBuilder<()> {
                XnnStaticResizeBilinear2DBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_new_height: impl ::planus::WriteAsDefault<u32, u32>,
                field_new_width: impl ::planus::WriteAsDefault<u32, u32>,
                field_input_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_new_height = field_new_height.prepare(builder, &0);
                let prepared_new_width = field_new_width.prepare(builder, &0);
                let prepared_input_id = field_input_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<14> =
                    ::core::default::Default::default();
                if prepared_new_height.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_new_width.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_input_id.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(4);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_new_height) =
                            prepared_new_height
                        {
                            object_writer.write::<_, _, 4>(&prepared_new_height);
                        }
                        if let ::core::option::Option::Some(prepared_new_width) = prepared_new_width
                        {
                            object_writer.write::<_, _, 4>(&prepared_new_width);
                        }
                        if let ::core::option::Option::Some(prepared_input_id) = prepared_input_id {
                            object_writer.write::<_, _, 4>(&prepared_input_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnStaticResizeBilinear2D>> for XnnStaticResizeBilinear2D {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticResizeBilinear2D> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnStaticResizeBilinear2D>>
            for XnnStaticResizeBilinear2D
        {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnStaticResizeBilinear2D>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnStaticResizeBilinear2D> for XnnStaticResizeBilinear2D {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticResizeBilinear2D> {
                XnnStaticResizeBilinear2D::create(
                    builder,
                    self.new_height,
                    self.new_width,
                    self.input_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnStaticResizeBilinear2D] type.
        ///
        /// Can be created using the [XnnStaticResizeBilinear2D::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnStaticResizeBilinear2DBuilder<State>(State);

        impl XnnStaticResizeBilinear2DBuilder<()> {
            /// Setter for the [`new_height` field](XnnStaticResizeBilinear2D#structfield.new_height).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn new_height<T0>(self, value: T0) -> XnnStaticResizeBilinear2DBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnStaticResizeBilinear2DBuilder((value,))
            }

            /// Sets the [`new_height` field](XnnStaticResizeBilinear2D#structfield.new_height) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn new_height_as_default(
                self,
            ) -> XnnStaticResizeBilinear2DBuilder<(::planus::DefaultValue,)> {
                self.new_height(::planus::DefaultValue)
            }
        }

        impl<T0> XnnStaticResizeBilinear2DBuilder<(T0,)> {
            /// Setter for the [`new_width` field](XnnStaticResizeBilinear2D#structfield.new_width).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn new_width<T1>(self, value: T1) -> XnnStaticResizeBilinear2DBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnStaticResizeBilinear2DBuilder((v0, value))
            }

            /// Sets the [`new_width` field](XnnStaticResizeBilinear2D#structfield.new_width) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn new_width_as_default(
                self,
            ) -> XnnStaticResizeBilinear2DBuilder<(T0, ::planus::DefaultValue)> {
                self.new_width(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnStaticResizeBilinear2DBuilder<(T0, T1)> {
            /// Setter for the [`input_id` field](XnnStaticResizeBilinear2D#structfield.input_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id<T2>(self, value: T2) -> XnnStaticResizeBilinear2DBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnStaticResizeBilinear2DBuilder((v0, v1, value))
            }

            /// Sets the [`input_id` field](XnnStaticResizeBilinear2D#structfield.input_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id_as_default(
                self,
            ) -> XnnStaticResizeBilinear2DBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.input_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnStaticResizeBilinear2DBuilder<(T0, T1, T2)> {
            /// Setter for the [`output_id` field](XnnStaticResizeBilinear2D#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T3>(
                self,
                value: T3,
            ) -> XnnStaticResizeBilinear2DBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnStaticResizeBilinear2DBuilder((v0, v1, v2, value))
            }

            /// Sets the [`output_id` field](XnnStaticResizeBilinear2D#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnStaticResizeBilinear2DBuilder<(T0, T1, T2, ::planus::DefaultValue)>
            {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnStaticResizeBilinear2DBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`flags` field](XnnStaticResizeBilinear2D#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T4>(
                self,
                value: T4,
            ) -> XnnStaticResizeBilinear2DBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnStaticResizeBilinear2DBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`flags` field](XnnStaticResizeBilinear2D#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnStaticResizeBilinear2DBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)>
            {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnStaticResizeBilinear2DBuilder<(T0, T1, T2, T3, T4)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnStaticResizeBilinear2D].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticResizeBilinear2D>
            where
                Self: ::planus::WriteAsOffset<XnnStaticResizeBilinear2D>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnStaticResizeBilinear2D>>
            for XnnStaticResizeBilinear2DBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<XnnStaticResizeBilinear2D>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticResizeBilinear2D> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnStaticResizeBilinear2D>>
            for XnnStaticResizeBilinear2DBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<XnnStaticResizeBilinear2D>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnStaticResizeBilinear2D>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnStaticResizeBilinear2D>
            for XnnStaticResizeBilinear2DBuilder<(T0, T1, T2, T3, T4)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticResizeBilinear2D> {
                let (v0, v1, v2, v3, v4) = &self.0;
                XnnStaticResizeBilinear2D::create(builder, v0, v1, v2, v3, v4)
            }
        }

        /// Reference to a deserialized [XnnStaticResizeBilinear2D].
        #[derive(Copy, Clone)]
        pub struct XnnStaticResizeBilinear2DRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> XnnStaticResizeBilinear2DRef<'a> {
            /// Getter for the [`new_height` field](XnnStaticResizeBilinear2D#structfield.new_height).
            #[inline]
            pub fn new_height(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "XnnStaticResizeBilinear2D", "new_height")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`new_width` field](XnnStaticResizeBilinear2D#structfield.new_width).
            #[inline]
            pub fn new_width(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "XnnStaticResizeBilinear2D", "new_width")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`input_id` field](XnnStaticResizeBilinear2D#structfield.input_id).
            #[inline]
            pub fn input_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "XnnStaticResizeBilinear2D", "input_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnStaticResizeBilinear2D#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "XnnStaticResizeBilinear2D", "output_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnStaticResizeBilinear2D#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "XnnStaticResizeBilinear2D", "flags")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for XnnStaticResizeBilinear2DRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnStaticResizeBilinear2DRef");
                f.field("new_height", &self.new_height());
                f.field("new_width", &self.new_width());
                f.field("input_id", &self.input_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnStaticResizeBilinear2DRef<'a>> for XnnStaticResizeBilinear2D {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnStaticResizeBilinear2DRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    new_height: ::core::convert::TryInto::try_into(value.new_height()?)?,
                    new_width: ::core::convert::TryInto::try_into(value.new_width()?)?,
                    input_id: ::core::convert::TryInto::try_into(value.input_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnStaticResizeBilinear2DRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnStaticResizeBilinear2DRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnStaticResizeBilinear2DRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnStaticResizeBilinear2D>>
            for XnnStaticResizeBilinear2D
        {
            type Value = ::planus::Offset<XnnStaticResizeBilinear2D>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnStaticResizeBilinear2D>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnStaticResizeBilinear2DRef<'a> {
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
                        "[XnnStaticResizeBilinear2DRef]",
                        "read_as_root",
                        0,
                    )
                })
            }
        }

        /// The table `XNNStaticConstantPad` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNStaticConstantPad` in the file `schema/xnnpack.fbs:200`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct XnnStaticConstantPad {
            /// The field `pre_paddings` in the table `XNNStaticConstantPad`
            pub pre_paddings: ::core::option::Option<::planus::alloc::vec::Vec<u32>>,
            /// The field `post_paddings` in the table `XNNStaticConstantPad`
            pub post_paddings: ::core::option::Option<::planus::alloc::vec::Vec<u32>>,
            /// The field `padding_value` in the table `XNNStaticConstantPad`
            pub padding_value: f32,
            /// The field `input_id` in the table `XNNStaticConstantPad`
            pub input_id: u32,
            /// The field `output_id` in the table `XNNStaticConstantPad`
            pub output_id: u32,
            /// The field `flags` in the table `XNNStaticConstantPad`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnStaticConstantPad {
            fn default() -> Self {
                Self {
                    pre_paddings: ::core::default::Default::default(),
                    post_paddings: ::core::default::Default::default(),
                    padding_value: 0.0,
                    input_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnStaticConstantPad {
            /// Creates a [XnnStaticConstantPadBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnStaticConstantPadBuilder<()> {
                XnnStaticConstantPadBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_pre_paddings: impl ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                field_post_paddings: impl ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                field_padding_value: impl ::planus::WriteAsDefault<f32, f32>,
                field_input_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_pre_paddings = field_pre_paddings.prepare(builder);
                let prepared_post_paddings = field_post_paddings.prepare(builder);
                let prepared_padding_value = field_padding_value.prepare(builder, &0.0);
                let prepared_input_id = field_input_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<16> =
                    ::core::default::Default::default();
                if prepared_pre_paddings.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u32]>>(0);
                }
                if prepared_post_paddings.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u32]>>(1);
                }
                if prepared_padding_value.is_some() {
                    table_writer.write_entry::<f32>(2);
                }
                if prepared_input_id.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(4);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(5);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_pre_paddings) =
                            prepared_pre_paddings
                        {
                            object_writer.write::<_, _, 4>(&prepared_pre_paddings);
                        }
                        if let ::core::option::Option::Some(prepared_post_paddings) =
                            prepared_post_paddings
                        {
                            object_writer.write::<_, _, 4>(&prepared_post_paddings);
                        }
                        if let ::core::option::Option::Some(prepared_padding_value) =
                            prepared_padding_value
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_value);
                        }
                        if let ::core::option::Option::Some(prepared_input_id) = prepared_input_id {
                            object_writer.write::<_, _, 4>(&prepared_input_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnStaticConstantPad>> for XnnStaticConstantPad {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticConstantPad> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnStaticConstantPad>> for XnnStaticConstantPad {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnStaticConstantPad>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnStaticConstantPad> for XnnStaticConstantPad {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticConstantPad> {
                XnnStaticConstantPad::create(
                    builder,
                    &self.pre_paddings,
                    &self.post_paddings,
                    self.padding_value,
                    self.input_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnStaticConstantPad] type.
        ///
        /// Can be created using the [XnnStaticConstantPad::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnStaticConstantPadBuilder<State>(State);

        impl XnnStaticConstantPadBuilder<()> {
            /// Setter for the [`pre_paddings` field](XnnStaticConstantPad#structfield.pre_paddings).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn pre_paddings<T0>(self, value: T0) -> XnnStaticConstantPadBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
            {
                XnnStaticConstantPadBuilder((value,))
            }

            /// Sets the [`pre_paddings` field](XnnStaticConstantPad#structfield.pre_paddings) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn pre_paddings_as_null(self) -> XnnStaticConstantPadBuilder<((),)> {
                self.pre_paddings(())
            }
        }

        impl<T0> XnnStaticConstantPadBuilder<(T0,)> {
            /// Setter for the [`post_paddings` field](XnnStaticConstantPad#structfield.post_paddings).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn post_paddings<T1>(self, value: T1) -> XnnStaticConstantPadBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
            {
                let (v0,) = self.0;
                XnnStaticConstantPadBuilder((v0, value))
            }

            /// Sets the [`post_paddings` field](XnnStaticConstantPad#structfield.post_paddings) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn post_paddings_as_null(self) -> XnnStaticConstantPadBuilder<(T0, ())> {
                self.post_paddings(())
            }
        }

        impl<T0, T1> XnnStaticConstantPadBuilder<(T0, T1)> {
            /// Setter for the [`padding_value` field](XnnStaticConstantPad#structfield.padding_value).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_value<T2>(self, value: T2) -> XnnStaticConstantPadBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<f32, f32>,
            {
                let (v0, v1) = self.0;
                XnnStaticConstantPadBuilder((v0, v1, value))
            }

            /// Sets the [`padding_value` field](XnnStaticConstantPad#structfield.padding_value) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_value_as_default(
                self,
            ) -> XnnStaticConstantPadBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.padding_value(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnStaticConstantPadBuilder<(T0, T1, T2)> {
            /// Setter for the [`input_id` field](XnnStaticConstantPad#structfield.input_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id<T3>(self, value: T3) -> XnnStaticConstantPadBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnStaticConstantPadBuilder((v0, v1, v2, value))
            }

            /// Sets the [`input_id` field](XnnStaticConstantPad#structfield.input_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id_as_default(
                self,
            ) -> XnnStaticConstantPadBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.input_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnStaticConstantPadBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`output_id` field](XnnStaticConstantPad#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T4>(
                self,
                value: T4,
            ) -> XnnStaticConstantPadBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnStaticConstantPadBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`output_id` field](XnnStaticConstantPad#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnStaticConstantPadBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnStaticConstantPadBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`flags` field](XnnStaticConstantPad#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T5>(
                self,
                value: T5,
            ) -> XnnStaticConstantPadBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                XnnStaticConstantPadBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`flags` field](XnnStaticConstantPad#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnStaticConstantPadBuilder<(T0, T1, T2, T3, T4, ::planus::DefaultValue)>
            {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5> XnnStaticConstantPadBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnStaticConstantPad].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticConstantPad>
            where
                Self: ::planus::WriteAsOffset<XnnStaticConstantPad>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsDefault<f32, f32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnStaticConstantPad>>
            for XnnStaticConstantPadBuilder<(T0, T1, T2, T3, T4, T5)>
        {
            type Prepared = ::planus::Offset<XnnStaticConstantPad>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticConstantPad> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsDefault<f32, f32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnStaticConstantPad>>
            for XnnStaticConstantPadBuilder<(T0, T1, T2, T3, T4, T5)>
        {
            type Prepared = ::planus::Offset<XnnStaticConstantPad>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnStaticConstantPad>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsDefault<f32, f32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnStaticConstantPad>
            for XnnStaticConstantPadBuilder<(T0, T1, T2, T3, T4, T5)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticConstantPad> {
                let (v0, v1, v2, v3, v4, v5) = &self.0;
                XnnStaticConstantPad::create(builder, v0, v1, v2, v3, v4, v5)
            }
        }

        /// Reference to a deserialized [XnnStaticConstantPad].
        #[derive(Copy, Clone)]
        pub struct XnnStaticConstantPadRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> XnnStaticConstantPadRef<'a> {
            /// Getter for the [`pre_paddings` field](XnnStaticConstantPad#structfield.pre_paddings).
            #[inline]
            pub fn pre_paddings(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u32>>> {
                self.0.access(0, "XnnStaticConstantPad", "pre_paddings")
            }

            /// Getter for the [`post_paddings` field](XnnStaticConstantPad#structfield.post_paddings).
            #[inline]
            pub fn post_paddings(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u32>>> {
                self.0.access(1, "XnnStaticConstantPad", "post_paddings")
            }

            /// Getter for the [`padding_value` field](XnnStaticConstantPad#structfield.padding_value).
            #[inline]
            pub fn padding_value(&self) -> ::planus::Result<f32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "XnnStaticConstantPad", "padding_value")?
                        .unwrap_or(0.0),
                )
            }

            /// Getter for the [`input_id` field](XnnStaticConstantPad#structfield.input_id).
            #[inline]
            pub fn input_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "XnnStaticConstantPad", "input_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnStaticConstantPad#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "XnnStaticConstantPad", "output_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnStaticConstantPad#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(5, "XnnStaticConstantPad", "flags")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for XnnStaticConstantPadRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnStaticConstantPadRef");
                if let ::core::option::Option::Some(field_pre_paddings) =
                    self.pre_paddings().transpose()
                {
                    f.field("pre_paddings", &field_pre_paddings);
                }
                if let ::core::option::Option::Some(field_post_paddings) =
                    self.post_paddings().transpose()
                {
                    f.field("post_paddings", &field_post_paddings);
                }
                f.field("padding_value", &self.padding_value());
                f.field("input_id", &self.input_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnStaticConstantPadRef<'a>> for XnnStaticConstantPad {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnStaticConstantPadRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    pre_paddings: if let ::core::option::Option::Some(pre_paddings) =
                        value.pre_paddings()?
                    {
                        ::core::option::Option::Some(pre_paddings.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    post_paddings: if let ::core::option::Option::Some(post_paddings) =
                        value.post_paddings()?
                    {
                        ::core::option::Option::Some(post_paddings.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    padding_value: ::core::convert::TryInto::try_into(value.padding_value()?)?,
                    input_id: ::core::convert::TryInto::try_into(value.input_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnStaticConstantPadRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnStaticConstantPadRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnStaticConstantPadRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnStaticConstantPad>> for XnnStaticConstantPad {
            type Value = ::planus::Offset<XnnStaticConstantPad>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnStaticConstantPad>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnStaticConstantPadRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnStaticConstantPadRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `_XNNNode2x1` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `_XNNNode2x1` in the file `schema/xnnpack.fbs:210`
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
        pub struct XnnNode2x1 {
            /// The field `input1_id` in the table `_XNNNode2x1`
            pub input1_id: u32,
            /// The field `input2_id` in the table `_XNNNode2x1`
            pub input2_id: u32,
            /// The field `output_id` in the table `_XNNNode2x1`
            pub output_id: u32,
            /// The field `flags` in the table `_XNNNode2x1`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnNode2x1 {
            fn default() -> Self {
                Self {
                    input1_id: 0,
                    input2_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnNode2x1 {
            /// Creates a [XnnNode2x1Builder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnNode2x1Builder<()> {
                XnnNode2x1Builder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_input1_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_input2_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_input1_id = field_input1_id.prepare(builder, &0);
                let prepared_input2_id = field_input2_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<12> =
                    ::core::default::Default::default();
                if prepared_input1_id.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_input2_id.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(3);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_input1_id) = prepared_input1_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_input1_id);
                        }
                        if let ::core::option::Option::Some(prepared_input2_id) = prepared_input2_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_input2_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnNode2x1>> for XnnNode2x1 {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNode2x1> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnNode2x1>> for XnnNode2x1 {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnNode2x1>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnNode2x1> for XnnNode2x1 {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNode2x1> {
                XnnNode2x1::create(
                    builder,
                    self.input1_id,
                    self.input2_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnNode2x1] type.
        ///
        /// Can be created using the [XnnNode2x1::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnNode2x1Builder<State>(State);

        impl XnnNode2x1Builder<()> {
            /// Setter for the [`input1_id` field](XnnNode2x1#structfield.input1_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input1_id<T0>(self, value: T0) -> XnnNode2x1Builder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnNode2x1Builder((value,))
            }

            /// Sets the [`input1_id` field](XnnNode2x1#structfield.input1_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input1_id_as_default(self) -> XnnNode2x1Builder<(::planus::DefaultValue,)> {
                self.input1_id(::planus::DefaultValue)
            }
        }

        impl<T0> XnnNode2x1Builder<(T0,)> {
            /// Setter for the [`input2_id` field](XnnNode2x1#structfield.input2_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input2_id<T1>(self, value: T1) -> XnnNode2x1Builder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnNode2x1Builder((v0, value))
            }

            /// Sets the [`input2_id` field](XnnNode2x1#structfield.input2_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input2_id_as_default(self) -> XnnNode2x1Builder<(T0, ::planus::DefaultValue)> {
                self.input2_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnNode2x1Builder<(T0, T1)> {
            /// Setter for the [`output_id` field](XnnNode2x1#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T2>(self, value: T2) -> XnnNode2x1Builder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnNode2x1Builder((v0, v1, value))
            }

            /// Sets the [`output_id` field](XnnNode2x1#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnNode2x1Builder<(T0, T1, ::planus::DefaultValue)> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnNode2x1Builder<(T0, T1, T2)> {
            /// Setter for the [`flags` field](XnnNode2x1#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T3>(self, value: T3) -> XnnNode2x1Builder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnNode2x1Builder((v0, v1, v2, value))
            }

            /// Sets the [`flags` field](XnnNode2x1#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnNode2x1Builder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnNode2x1Builder<(T0, T1, T2, T3)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnNode2x1].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNode2x1>
            where
                Self: ::planus::WriteAsOffset<XnnNode2x1>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnNode2x1>>
            for XnnNode2x1Builder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<XnnNode2x1>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNode2x1> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnNode2x1>>
            for XnnNode2x1Builder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<XnnNode2x1>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnNode2x1>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnNode2x1> for XnnNode2x1Builder<(T0, T1, T2, T3)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNode2x1> {
                let (v0, v1, v2, v3) = &self.0;
                XnnNode2x1::create(builder, v0, v1, v2, v3)
            }
        }

        /// Reference to a deserialized [XnnNode2x1].
        #[derive(Copy, Clone)]
        pub struct XnnNode2x1Ref<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnNode2x1Ref<'a> {
            /// Getter for the [`input1_id` field](XnnNode2x1#structfield.input1_id).
            #[inline]
            pub fn input1_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(0, "XnnNode2x1", "input1_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`input2_id` field](XnnNode2x1#structfield.input2_id).
            #[inline]
            pub fn input2_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(1, "XnnNode2x1", "input2_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnNode2x1#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(2, "XnnNode2x1", "output_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnNode2x1#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(3, "XnnNode2x1", "flags")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for XnnNode2x1Ref<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnNode2x1Ref");
                f.field("input1_id", &self.input1_id());
                f.field("input2_id", &self.input2_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnNode2x1Ref<'a>> for XnnNode2x1 {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnNode2x1Ref<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    input1_id: ::core::convert::TryInto::try_into(value.input1_id()?)?,
                    input2_id: ::core::convert::TryInto::try_into(value.input2_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnNode2x1Ref<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnNode2x1Ref<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnNode2x1Ref]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnNode2x1>> for XnnNode2x1 {
            type Value = ::planus::Offset<XnnNode2x1>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnNode2x1>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnNode2x1Ref<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnNode2x1Ref]", "read_as_root", 0)
                })
            }
        }

        /// The table `_XNNNode1x1` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `_XNNNode1x1` in the file `schema/xnnpack.fbs:218`
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
        pub struct XnnNode1x1 {
            /// The field `input_id` in the table `_XNNNode1x1`
            pub input_id: u32,
            /// The field `output_id` in the table `_XNNNode1x1`
            pub output_id: u32,
            /// The field `flags` in the table `_XNNNode1x1`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnNode1x1 {
            fn default() -> Self {
                Self {
                    input_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnNode1x1 {
            /// Creates a [XnnNode1x1Builder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnNode1x1Builder<()> {
                XnnNode1x1Builder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_input_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_input_id = field_input_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<10> =
                    ::core::default::Default::default();
                if prepared_input_id.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(2);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_input_id) = prepared_input_id {
                            object_writer.write::<_, _, 4>(&prepared_input_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnNode1x1>> for XnnNode1x1 {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNode1x1> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnNode1x1>> for XnnNode1x1 {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnNode1x1>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnNode1x1> for XnnNode1x1 {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNode1x1> {
                XnnNode1x1::create(builder, self.input_id, self.output_id, self.flags)
            }
        }

        /// Builder for serializing an instance of the [XnnNode1x1] type.
        ///
        /// Can be created using the [XnnNode1x1::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnNode1x1Builder<State>(State);

        impl XnnNode1x1Builder<()> {
            /// Setter for the [`input_id` field](XnnNode1x1#structfield.input_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id<T0>(self, value: T0) -> XnnNode1x1Builder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnNode1x1Builder((value,))
            }

            /// Sets the [`input_id` field](XnnNode1x1#structfield.input_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id_as_default(self) -> XnnNode1x1Builder<(::planus::DefaultValue,)> {
                self.input_id(::planus::DefaultValue)
            }
        }

        impl<T0> XnnNode1x1Builder<(T0,)> {
            /// Setter for the [`output_id` field](XnnNode1x1#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T1>(self, value: T1) -> XnnNode1x1Builder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnNode1x1Builder((v0, value))
            }

            /// Sets the [`output_id` field](XnnNode1x1#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(self) -> XnnNode1x1Builder<(T0, ::planus::DefaultValue)> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnNode1x1Builder<(T0, T1)> {
            /// Setter for the [`flags` field](XnnNode1x1#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T2>(self, value: T2) -> XnnNode1x1Builder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnNode1x1Builder((v0, v1, value))
            }

            /// Sets the [`flags` field](XnnNode1x1#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(self) -> XnnNode1x1Builder<(T0, T1, ::planus::DefaultValue)> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnNode1x1Builder<(T0, T1, T2)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnNode1x1].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNode1x1>
            where
                Self: ::planus::WriteAsOffset<XnnNode1x1>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnNode1x1>> for XnnNode1x1Builder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<XnnNode1x1>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNode1x1> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnNode1x1>>
            for XnnNode1x1Builder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<XnnNode1x1>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnNode1x1>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnNode1x1> for XnnNode1x1Builder<(T0, T1, T2)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNode1x1> {
                let (v0, v1, v2) = &self.0;
                XnnNode1x1::create(builder, v0, v1, v2)
            }
        }

        /// Reference to a deserialized [XnnNode1x1].
        #[derive(Copy, Clone)]
        pub struct XnnNode1x1Ref<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnNode1x1Ref<'a> {
            /// Getter for the [`input_id` field](XnnNode1x1#structfield.input_id).
            #[inline]
            pub fn input_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(0, "XnnNode1x1", "input_id")?.unwrap_or(0))
            }

            /// Getter for the [`output_id` field](XnnNode1x1#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(1, "XnnNode1x1", "output_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnNode1x1#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(2, "XnnNode1x1", "flags")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for XnnNode1x1Ref<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnNode1x1Ref");
                f.field("input_id", &self.input_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnNode1x1Ref<'a>> for XnnNode1x1 {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnNode1x1Ref<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    input_id: ::core::convert::TryInto::try_into(value.input_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnNode1x1Ref<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnNode1x1Ref<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnNode1x1Ref]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnNode1x1>> for XnnNode1x1 {
            type Value = ::planus::Offset<XnnNode1x1>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnNode1x1>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnNode1x1Ref<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnNode1x1Ref]", "read_as_root", 0)
                })
            }
        }

        /// The table `_XNNCat` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `_XNNCat` in the file `schema/xnnpack.fbs:225`
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
        pub struct XnnCat {
            /// The field `axis` in the table `_XNNCat`
            pub axis: u32,
            /// The field `input1_id` in the table `_XNNCat`
            pub input1_id: u32,
            /// The field `input2_id` in the table `_XNNCat`
            pub input2_id: u32,
            /// The field `input3_id` in the table `_XNNCat`
            pub input3_id: u32,
            /// The field `input4_id` in the table `_XNNCat`
            pub input4_id: u32,
            /// The field `output_id` in the table `_XNNCat`
            pub output_id: u32,
            /// The field `flags` in the table `_XNNCat`
            pub flags: u32,
            /// The field `input5_id` in the table `_XNNCat`
            pub input5_id: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnCat {
            fn default() -> Self {
                Self {
                    axis: 0,
                    input1_id: 0,
                    input2_id: 0,
                    input3_id: 0,
                    input4_id: 0,
                    output_id: 0,
                    flags: 0,
                    input5_id: 0,
                }
            }
        }

        impl XnnCat {
            /// Creates a [XnnCatBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnCatBuilder<()> {
                XnnCatBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_axis: impl ::planus::WriteAsDefault<u32, u32>,
                field_input1_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_input2_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_input3_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_input4_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
                field_input5_id: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_axis = field_axis.prepare(builder, &0);
                let prepared_input1_id = field_input1_id.prepare(builder, &0);
                let prepared_input2_id = field_input2_id.prepare(builder, &0);
                let prepared_input3_id = field_input3_id.prepare(builder, &0);
                let prepared_input4_id = field_input4_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);
                let prepared_input5_id = field_input5_id.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<20> =
                    ::core::default::Default::default();
                if prepared_axis.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_input1_id.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_input2_id.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_input3_id.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_input4_id.is_some() {
                    table_writer.write_entry::<u32>(4);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(5);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(6);
                }
                if prepared_input5_id.is_some() {
                    table_writer.write_entry::<u32>(7);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_axis) = prepared_axis {
                            object_writer.write::<_, _, 4>(&prepared_axis);
                        }
                        if let ::core::option::Option::Some(prepared_input1_id) = prepared_input1_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_input1_id);
                        }
                        if let ::core::option::Option::Some(prepared_input2_id) = prepared_input2_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_input2_id);
                        }
                        if let ::core::option::Option::Some(prepared_input3_id) = prepared_input3_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_input3_id);
                        }
                        if let ::core::option::Option::Some(prepared_input4_id) = prepared_input4_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_input4_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                        if let ::core::option::Option::Some(prepared_input5_id) = prepared_input5_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_input5_id);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnCat>> for XnnCat {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnCat> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnCat>> for XnnCat {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnCat>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnCat> for XnnCat {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnCat> {
                XnnCat::create(
                    builder,
                    self.axis,
                    self.input1_id,
                    self.input2_id,
                    self.input3_id,
                    self.input4_id,
                    self.output_id,
                    self.flags,
                    self.input5_id,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnCat] type.
        ///
        /// Can be created using the [XnnCat::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnCatBuilder<State>(State);

        impl XnnCatBuilder<()> {
            /// Setter for the [`axis` field](XnnCat#structfield.axis).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn axis<T0>(self, value: T0) -> XnnCatBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnCatBuilder((value,))
            }

            /// Sets the [`axis` field](XnnCat#structfield.axis) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn axis_as_default(self) -> XnnCatBuilder<(::planus::DefaultValue,)> {
                self.axis(::planus::DefaultValue)
            }
        }

        impl<T0> XnnCatBuilder<(T0,)> {
            /// Setter for the [`input1_id` field](XnnCat#structfield.input1_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input1_id<T1>(self, value: T1) -> XnnCatBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnCatBuilder((v0, value))
            }

            /// Sets the [`input1_id` field](XnnCat#structfield.input1_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input1_id_as_default(self) -> XnnCatBuilder<(T0, ::planus::DefaultValue)> {
                self.input1_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnCatBuilder<(T0, T1)> {
            /// Setter for the [`input2_id` field](XnnCat#structfield.input2_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input2_id<T2>(self, value: T2) -> XnnCatBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnCatBuilder((v0, v1, value))
            }

            /// Sets the [`input2_id` field](XnnCat#structfield.input2_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input2_id_as_default(self) -> XnnCatBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.input2_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnCatBuilder<(T0, T1, T2)> {
            /// Setter for the [`input3_id` field](XnnCat#structfield.input3_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input3_id<T3>(self, value: T3) -> XnnCatBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnCatBuilder((v0, v1, v2, value))
            }

            /// Sets the [`input3_id` field](XnnCat#structfield.input3_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input3_id_as_default(
                self,
            ) -> XnnCatBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.input3_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnCatBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`input4_id` field](XnnCat#structfield.input4_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input4_id<T4>(self, value: T4) -> XnnCatBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnCatBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`input4_id` field](XnnCat#structfield.input4_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input4_id_as_default(
                self,
            ) -> XnnCatBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.input4_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnCatBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`output_id` field](XnnCat#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T5>(self, value: T5) -> XnnCatBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                XnnCatBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`output_id` field](XnnCat#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnCatBuilder<(T0, T1, T2, T3, T4, ::planus::DefaultValue)> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5> XnnCatBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Setter for the [`flags` field](XnnCat#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T6>(self, value: T6) -> XnnCatBuilder<(T0, T1, T2, T3, T4, T5, T6)>
            where
                T6: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5) = self.0;
                XnnCatBuilder((v0, v1, v2, v3, v4, v5, value))
            }

            /// Sets the [`flags` field](XnnCat#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnCatBuilder<(T0, T1, T2, T3, T4, T5, ::planus::DefaultValue)> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6> XnnCatBuilder<(T0, T1, T2, T3, T4, T5, T6)> {
            /// Setter for the [`input5_id` field](XnnCat#structfield.input5_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input5_id<T7>(self, value: T7) -> XnnCatBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
            where
                T7: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6) = self.0;
                XnnCatBuilder((v0, v1, v2, v3, v4, v5, v6, value))
            }

            /// Sets the [`input5_id` field](XnnCat#structfield.input5_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input5_id_as_default(
                self,
            ) -> XnnCatBuilder<(T0, T1, T2, T3, T4, T5, T6, ::planus::DefaultValue)> {
                self.input5_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7> XnnCatBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnCat].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnCat>
            where
                Self: ::planus::WriteAsOffset<XnnCat>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnCat>>
            for XnnCatBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
        {
            type Prepared = ::planus::Offset<XnnCat>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnCat> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnCat>>
            for XnnCatBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
        {
            type Prepared = ::planus::Offset<XnnCat>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnCat>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnCat> for XnnCatBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnCat> {
                let (v0, v1, v2, v3, v4, v5, v6, v7) = &self.0;
                XnnCat::create(builder, v0, v1, v2, v3, v4, v5, v6, v7)
            }
        }

        /// Reference to a deserialized [XnnCat].
        #[derive(Copy, Clone)]
        pub struct XnnCatRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnCatRef<'a> {
            /// Getter for the [`axis` field](XnnCat#structfield.axis).
            #[inline]
            pub fn axis(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(0, "XnnCat", "axis")?.unwrap_or(0))
            }

            /// Getter for the [`input1_id` field](XnnCat#structfield.input1_id).
            #[inline]
            pub fn input1_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(1, "XnnCat", "input1_id")?.unwrap_or(0))
            }

            /// Getter for the [`input2_id` field](XnnCat#structfield.input2_id).
            #[inline]
            pub fn input2_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(2, "XnnCat", "input2_id")?.unwrap_or(0))
            }

            /// Getter for the [`input3_id` field](XnnCat#structfield.input3_id).
            #[inline]
            pub fn input3_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(3, "XnnCat", "input3_id")?.unwrap_or(0))
            }

            /// Getter for the [`input4_id` field](XnnCat#structfield.input4_id).
            #[inline]
            pub fn input4_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(4, "XnnCat", "input4_id")?.unwrap_or(0))
            }

            /// Getter for the [`output_id` field](XnnCat#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(5, "XnnCat", "output_id")?.unwrap_or(0))
            }

            /// Getter for the [`flags` field](XnnCat#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(6, "XnnCat", "flags")?.unwrap_or(0))
            }

            /// Getter for the [`input5_id` field](XnnCat#structfield.input5_id).
            #[inline]
            pub fn input5_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(7, "XnnCat", "input5_id")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for XnnCatRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnCatRef");
                f.field("axis", &self.axis());
                f.field("input1_id", &self.input1_id());
                f.field("input2_id", &self.input2_id());
                f.field("input3_id", &self.input3_id());
                f.field("input4_id", &self.input4_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.field("input5_id", &self.input5_id());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnCatRef<'a>> for XnnCat {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnCatRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    axis: ::core::convert::TryInto::try_into(value.axis()?)?,
                    input1_id: ::core::convert::TryInto::try_into(value.input1_id()?)?,
                    input2_id: ::core::convert::TryInto::try_into(value.input2_id()?)?,
                    input3_id: ::core::convert::TryInto::try_into(value.input3_id()?)?,
                    input4_id: ::core::convert::TryInto::try_into(value.input4_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                    input5_id: ::core::convert::TryInto::try_into(value.input5_id()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnCatRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnCatRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[XnnCatRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnCat>> for XnnCat {
            type Value = ::planus::Offset<XnnCat>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnCat>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnCatRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnCatRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNELU` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNELU` in the file `schema/xnnpack.fbs:236`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct Xnnelu {
            /// The field `alpha` in the table `XNNELU`
            pub alpha: f32,
            /// The field `input_id` in the table `XNNELU`
            pub input_id: u32,
            /// The field `output_id` in the table `XNNELU`
            pub output_id: u32,
            /// The field `flags` in the table `XNNELU`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for Xnnelu {
            fn default() -> Self {
                Self {
                    alpha: 0.0,
                    input_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl Xnnelu {
            /// Creates a [XnneluBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnneluBuilder<()> {
                XnneluBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_alpha: impl ::planus::WriteAsDefault<f32, f32>,
                field_input_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_alpha = field_alpha.prepare(builder, &0.0);
                let prepared_input_id = field_input_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<12> =
                    ::core::default::Default::default();
                if prepared_alpha.is_some() {
                    table_writer.write_entry::<f32>(0);
                }
                if prepared_input_id.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(3);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_alpha) = prepared_alpha {
                            object_writer.write::<_, _, 4>(&prepared_alpha);
                        }
                        if let ::core::option::Option::Some(prepared_input_id) = prepared_input_id {
                            object_writer.write::<_, _, 4>(&prepared_input_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<Xnnelu>> for Xnnelu {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Xnnelu> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<Xnnelu>> for Xnnelu {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Xnnelu>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<Xnnelu> for Xnnelu {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Xnnelu> {
                Xnnelu::create(
                    builder,
                    self.alpha,
                    self.input_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [Xnnelu] type.
        ///
        /// Can be created using the [Xnnelu::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnneluBuilder<State>(State);

        impl XnneluBuilder<()> {
            /// Setter for the [`alpha` field](Xnnelu#structfield.alpha).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn alpha<T0>(self, value: T0) -> XnneluBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<f32, f32>,
            {
                XnneluBuilder((value,))
            }

            /// Sets the [`alpha` field](Xnnelu#structfield.alpha) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn alpha_as_default(self) -> XnneluBuilder<(::planus::DefaultValue,)> {
                self.alpha(::planus::DefaultValue)
            }
        }

        impl<T0> XnneluBuilder<(T0,)> {
            /// Setter for the [`input_id` field](Xnnelu#structfield.input_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id<T1>(self, value: T1) -> XnneluBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnneluBuilder((v0, value))
            }

            /// Sets the [`input_id` field](Xnnelu#structfield.input_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id_as_default(self) -> XnneluBuilder<(T0, ::planus::DefaultValue)> {
                self.input_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnneluBuilder<(T0, T1)> {
            /// Setter for the [`output_id` field](Xnnelu#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T2>(self, value: T2) -> XnneluBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnneluBuilder((v0, v1, value))
            }

            /// Sets the [`output_id` field](Xnnelu#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(self) -> XnneluBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnneluBuilder<(T0, T1, T2)> {
            /// Setter for the [`flags` field](Xnnelu#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T3>(self, value: T3) -> XnneluBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnneluBuilder((v0, v1, v2, value))
            }

            /// Sets the [`flags` field](Xnnelu#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(self) -> XnneluBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnneluBuilder<(T0, T1, T2, T3)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [Xnnelu].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<Xnnelu>
            where
                Self: ::planus::WriteAsOffset<Xnnelu>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<f32, f32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<Xnnelu>> for XnneluBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<Xnnelu>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Xnnelu> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<f32, f32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<Xnnelu>>
            for XnneluBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<Xnnelu>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<Xnnelu>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<f32, f32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<Xnnelu> for XnneluBuilder<(T0, T1, T2, T3)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<Xnnelu> {
                let (v0, v1, v2, v3) = &self.0;
                Xnnelu::create(builder, v0, v1, v2, v3)
            }
        }

        /// Reference to a deserialized [Xnnelu].
        #[derive(Copy, Clone)]
        pub struct XnneluRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnneluRef<'a> {
            /// Getter for the [`alpha` field](Xnnelu#structfield.alpha).
            #[inline]
            pub fn alpha(&self) -> ::planus::Result<f32> {
                ::core::result::Result::Ok(self.0.access(0, "Xnnelu", "alpha")?.unwrap_or(0.0))
            }

            /// Getter for the [`input_id` field](Xnnelu#structfield.input_id).
            #[inline]
            pub fn input_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(1, "Xnnelu", "input_id")?.unwrap_or(0))
            }

            /// Getter for the [`output_id` field](Xnnelu#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(2, "Xnnelu", "output_id")?.unwrap_or(0))
            }

            /// Getter for the [`flags` field](Xnnelu#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(3, "Xnnelu", "flags")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for XnneluRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnneluRef");
                f.field("alpha", &self.alpha());
                f.field("input_id", &self.input_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnneluRef<'a>> for Xnnelu {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnneluRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    alpha: ::core::convert::TryInto::try_into(value.alpha()?)?,
                    input_id: ::core::convert::TryInto::try_into(value.input_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnneluRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnneluRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[XnneluRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<Xnnelu>> for Xnnelu {
            type Value = ::planus::Offset<Xnnelu>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<Xnnelu>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnneluRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnneluRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNFullyConnected` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNFullyConnected` in the file `schema/xnnpack.fbs:243`
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
        pub struct XnnFullyConnected {
            /// The field `input1_id` in the table `XNNFullyConnected`
            pub input1_id: u32,
            /// The field `filter_id` in the table `XNNFullyConnected`
            pub filter_id: u32,
            /// The field `bias_id` in the table `XNNFullyConnected`
            pub bias_id: u32,
            /// The field `output_id` in the table `XNNFullyConnected`
            pub output_id: u32,
            /// The field `flags` in the table `XNNFullyConnected`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnFullyConnected {
            fn default() -> Self {
                Self {
                    input1_id: 0,
                    filter_id: 0,
                    bias_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnFullyConnected {
            /// Creates a [XnnFullyConnectedBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnFullyConnectedBuilder<()> {
                XnnFullyConnectedBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_input1_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_filter_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_bias_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_input1_id = field_input1_id.prepare(builder, &0);
                let prepared_filter_id = field_filter_id.prepare(builder, &0);
                let prepared_bias_id = field_bias_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<14> =
                    ::core::default::Default::default();
                if prepared_input1_id.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_filter_id.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_bias_id.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(4);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_input1_id) = prepared_input1_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_input1_id);
                        }
                        if let ::core::option::Option::Some(prepared_filter_id) = prepared_filter_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_filter_id);
                        }
                        if let ::core::option::Option::Some(prepared_bias_id) = prepared_bias_id {
                            object_writer.write::<_, _, 4>(&prepared_bias_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnFullyConnected>> for XnnFullyConnected {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnFullyConnected> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnFullyConnected>> for XnnFullyConnected {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnFullyConnected>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnFullyConnected> for XnnFullyConnected {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnFullyConnected> {
                XnnFullyConnected::create(
                    builder,
                    self.input1_id,
                    self.filter_id,
                    self.bias_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnFullyConnected] type.
        ///
        /// Can be created using the [XnnFullyConnected::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnFullyConnectedBuilder<State>(State);

        impl XnnFullyConnectedBuilder<()> {
            /// Setter for the [`input1_id` field](XnnFullyConnected#structfield.input1_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input1_id<T0>(self, value: T0) -> XnnFullyConnectedBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnFullyConnectedBuilder((value,))
            }

            /// Sets the [`input1_id` field](XnnFullyConnected#structfield.input1_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input1_id_as_default(
                self,
            ) -> XnnFullyConnectedBuilder<(::planus::DefaultValue,)> {
                self.input1_id(::planus::DefaultValue)
            }
        }

        impl<T0> XnnFullyConnectedBuilder<(T0,)> {
            /// Setter for the [`filter_id` field](XnnFullyConnected#structfield.filter_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn filter_id<T1>(self, value: T1) -> XnnFullyConnectedBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnFullyConnectedBuilder((v0, value))
            }

            /// Sets the [`filter_id` field](XnnFullyConnected#structfield.filter_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn filter_id_as_default(
                self,
            ) -> XnnFullyConnectedBuilder<(T0, ::planus::DefaultValue)> {
                self.filter_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnFullyConnectedBuilder<(T0, T1)> {
            /// Setter for the [`bias_id` field](XnnFullyConnected#structfield.bias_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn bias_id<T2>(self, value: T2) -> XnnFullyConnectedBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnFullyConnectedBuilder((v0, v1, value))
            }

            /// Sets the [`bias_id` field](XnnFullyConnected#structfield.bias_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn bias_id_as_default(
                self,
            ) -> XnnFullyConnectedBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.bias_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnFullyConnectedBuilder<(T0, T1, T2)> {
            /// Setter for the [`output_id` field](XnnFullyConnected#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T3>(self, value: T3) -> XnnFullyConnectedBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnFullyConnectedBuilder((v0, v1, v2, value))
            }

            /// Sets the [`output_id` field](XnnFullyConnected#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnFullyConnectedBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnFullyConnectedBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`flags` field](XnnFullyConnected#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T4>(self, value: T4) -> XnnFullyConnectedBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnFullyConnectedBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`flags` field](XnnFullyConnected#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnFullyConnectedBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnFullyConnectedBuilder<(T0, T1, T2, T3, T4)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnFullyConnected].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnFullyConnected>
            where
                Self: ::planus::WriteAsOffset<XnnFullyConnected>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnFullyConnected>>
            for XnnFullyConnectedBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<XnnFullyConnected>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnFullyConnected> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnFullyConnected>>
            for XnnFullyConnectedBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<XnnFullyConnected>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnFullyConnected>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnFullyConnected>
            for XnnFullyConnectedBuilder<(T0, T1, T2, T3, T4)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnFullyConnected> {
                let (v0, v1, v2, v3, v4) = &self.0;
                XnnFullyConnected::create(builder, v0, v1, v2, v3, v4)
            }
        }

        /// Reference to a deserialized [XnnFullyConnected].
        #[derive(Copy, Clone)]
        pub struct XnnFullyConnectedRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnFullyConnectedRef<'a> {
            /// Getter for the [`input1_id` field](XnnFullyConnected#structfield.input1_id).
            #[inline]
            pub fn input1_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "XnnFullyConnected", "input1_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`filter_id` field](XnnFullyConnected#structfield.filter_id).
            #[inline]
            pub fn filter_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "XnnFullyConnected", "filter_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`bias_id` field](XnnFullyConnected#structfield.bias_id).
            #[inline]
            pub fn bias_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "XnnFullyConnected", "bias_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnFullyConnected#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "XnnFullyConnected", "output_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnFullyConnected#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(4, "XnnFullyConnected", "flags")?.unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for XnnFullyConnectedRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnFullyConnectedRef");
                f.field("input1_id", &self.input1_id());
                f.field("filter_id", &self.filter_id());
                f.field("bias_id", &self.bias_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnFullyConnectedRef<'a>> for XnnFullyConnected {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnFullyConnectedRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    input1_id: ::core::convert::TryInto::try_into(value.input1_id()?)?,
                    filter_id: ::core::convert::TryInto::try_into(value.filter_id()?)?,
                    bias_id: ::core::convert::TryInto::try_into(value.bias_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnFullyConnectedRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnFullyConnectedRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnFullyConnectedRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnFullyConnected>> for XnnFullyConnected {
            type Value = ::planus::Offset<XnnFullyConnected>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnFullyConnected>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnFullyConnectedRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnFullyConnectedRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `_XNNNodeConv` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `_XNNNodeConv` in the file `schema/xnnpack.fbs:253`
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
        pub struct XnnNodeConv {
            /// The field `padding_top` in the table `_XNNNodeConv`
            pub padding_top: u32,
            /// The field `padding_right` in the table `_XNNNodeConv`
            pub padding_right: u32,
            /// The field `padding_bottom` in the table `_XNNNodeConv`
            pub padding_bottom: u32,
            /// The field `padding_left` in the table `_XNNNodeConv`
            pub padding_left: u32,
            /// The field `kernel_height` in the table `_XNNNodeConv`
            pub kernel_height: u32,
            /// The field `kernel_width` in the table `_XNNNodeConv`
            pub kernel_width: u32,
            /// The field `subsampling_height` in the table `_XNNNodeConv`
            pub subsampling_height: u32,
            /// The field `subsampling_width` in the table `_XNNNodeConv`
            pub subsampling_width: u32,
            /// The field `dilation_height` in the table `_XNNNodeConv`
            pub dilation_height: u32,
            /// The field `dilation_width` in the table `_XNNNodeConv`
            pub dilation_width: u32,
            /// The field `group_input_channels` in the table `_XNNNodeConv`
            pub group_input_channels: u32,
            /// The field `group_output_channels` in the table `_XNNNodeConv`
            pub group_output_channels: u32,
            /// The field `groups` in the table `_XNNNodeConv`
            pub groups: u32,
            /// The field `adjustment_height` in the table `_XNNNodeConv`
            pub adjustment_height: u32,
            /// The field `adjustment_width` in the table `_XNNNodeConv`
            pub adjustment_width: u32,
            /// The field `input1_id` in the table `_XNNNodeConv`
            pub input1_id: u32,
            /// The field `filter_id` in the table `_XNNNodeConv`
            pub filter_id: u32,
            /// The field `bias_id` in the table `_XNNNodeConv`
            pub bias_id: u32,
            /// The field `output_id` in the table `_XNNNodeConv`
            pub output_id: u32,
            /// The field `flags` in the table `_XNNNodeConv`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnNodeConv {
            fn default() -> Self {
                Self {
                    padding_top: 0,
                    padding_right: 0,
                    padding_bottom: 0,
                    padding_left: 0,
                    kernel_height: 0,
                    kernel_width: 0,
                    subsampling_height: 0,
                    subsampling_width: 0,
                    dilation_height: 0,
                    dilation_width: 0,
                    group_input_channels: 0,
                    group_output_channels: 0,
                    groups: 0,
                    adjustment_height: 0,
                    adjustment_width: 0,
                    input1_id: 0,
                    filter_id: 0,
                    bias_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnNodeConv {
            /// Creates a [XnnNodeConvBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnNodeConvBuilder<()> {
                XnnNodeConvBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_padding_top: impl ::planus::WriteAsDefault<u32, u32>,
                field_padding_right: impl ::planus::WriteAsDefault<u32, u32>,
                field_padding_bottom: impl ::planus::WriteAsDefault<u32, u32>,
                field_padding_left: impl ::planus::WriteAsDefault<u32, u32>,
                field_kernel_height: impl ::planus::WriteAsDefault<u32, u32>,
                field_kernel_width: impl ::planus::WriteAsDefault<u32, u32>,
                field_subsampling_height: impl ::planus::WriteAsDefault<u32, u32>,
                field_subsampling_width: impl ::planus::WriteAsDefault<u32, u32>,
                field_dilation_height: impl ::planus::WriteAsDefault<u32, u32>,
                field_dilation_width: impl ::planus::WriteAsDefault<u32, u32>,
                field_group_input_channels: impl ::planus::WriteAsDefault<u32, u32>,
                field_group_output_channels: impl ::planus::WriteAsDefault<u32, u32>,
                field_groups: impl ::planus::WriteAsDefault<u32, u32>,
                field_adjustment_height: impl ::planus::WriteAsDefault<u32, u32>,
                field_adjustment_width: impl ::planus::WriteAsDefault<u32, u32>,
                field_input1_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_filter_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_bias_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_padding_top = field_padding_top.prepare(builder, &0);
                let prepared_padding_right = field_padding_right.prepare(builder, &0);
                let prepared_padding_bottom = field_padding_bottom.prepare(builder, &0);
                let prepared_padding_left = field_padding_left.prepare(builder, &0);
                let prepared_kernel_height = field_kernel_height.prepare(builder, &0);
                let prepared_kernel_width = field_kernel_width.prepare(builder, &0);
                let prepared_subsampling_height = field_subsampling_height.prepare(builder, &0);
                let prepared_subsampling_width = field_subsampling_width.prepare(builder, &0);
                let prepared_dilation_height = field_dilation_height.prepare(builder, &0);
                let prepared_dilation_width = field_dilation_width.prepare(builder, &0);
                let prepared_group_input_channels = field_group_input_channels.prepare(builder, &0);
                let prepared_group_output_channels =
                    field_group_output_channels.prepare(builder, &0);
                let prepared_groups = field_groups.prepare(builder, &0);
                let prepared_adjustment_height = field_adjustment_height.prepare(builder, &0);
                let prepared_adjustment_width = field_adjustment_width.prepare(builder, &0);
                let prepared_input1_id = field_input1_id.prepare(builder, &0);
                let prepared_filter_id = field_filter_id.prepare(builder, &0);
                let prepared_bias_id = field_bias_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<44> =
                    ::core::default::Default::default();
                if prepared_padding_top.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_padding_right.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_padding_bottom.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_padding_left.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_kernel_height.is_some() {
                    table_writer.write_entry::<u32>(4);
                }
                if prepared_kernel_width.is_some() {
                    table_writer.write_entry::<u32>(5);
                }
                if prepared_subsampling_height.is_some() {
                    table_writer.write_entry::<u32>(6);
                }
                if prepared_subsampling_width.is_some() {
                    table_writer.write_entry::<u32>(7);
                }
                if prepared_dilation_height.is_some() {
                    table_writer.write_entry::<u32>(8);
                }
                if prepared_dilation_width.is_some() {
                    table_writer.write_entry::<u32>(9);
                }
                if prepared_group_input_channels.is_some() {
                    table_writer.write_entry::<u32>(10);
                }
                if prepared_group_output_channels.is_some() {
                    table_writer.write_entry::<u32>(11);
                }
                if prepared_groups.is_some() {
                    table_writer.write_entry::<u32>(12);
                }
                if prepared_adjustment_height.is_some() {
                    table_writer.write_entry::<u32>(13);
                }
                if prepared_adjustment_width.is_some() {
                    table_writer.write_entry::<u32>(14);
                }
                if prepared_input1_id.is_some() {
                    table_writer.write_entry::<u32>(15);
                }
                if prepared_filter_id.is_some() {
                    table_writer.write_entry::<u32>(16);
                }
                if prepared_bias_id.is_some() {
                    table_writer.write_entry::<u32>(17);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(18);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(19);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_padding_top) =
                            prepared_padding_top
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_top);
                        }
                        if let ::core::option::Option::Some(prepared_padding_right) =
                            prepared_padding_right
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_right);
                        }
                        if let ::core::option::Option::Some(prepared_padding_bottom) =
                            prepared_padding_bottom
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_bottom);
                        }
                        if let ::core::option::Option::Some(prepared_padding_left) =
                            prepared_padding_left
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_left);
                        }
                        if let ::core::option::Option::Some(prepared_kernel_height) =
                            prepared_kernel_height
                        {
                            object_writer.write::<_, _, 4>(&prepared_kernel_height);
                        }
                        if let ::core::option::Option::Some(prepared_kernel_width) =
                            prepared_kernel_width
                        {
                            object_writer.write::<_, _, 4>(&prepared_kernel_width);
                        }
                        if let ::core::option::Option::Some(prepared_subsampling_height) =
                            prepared_subsampling_height
                        {
                            object_writer.write::<_, _, 4>(&prepared_subsampling_height);
                        }
                        if let ::core::option::Option::Some(prepared_subsampling_width) =
                            prepared_subsampling_width
                        {
                            object_writer.write::<_, _, 4>(&prepared_subsampling_width);
                        }
                        if let ::core::option::Option::Some(prepared_dilation_height) =
                            prepared_dilation_height
                        {
                            object_writer.write::<_, _, 4>(&prepared_dilation_height);
                        }
                        if let ::core::option::Option::Some(prepared_dilation_width) =
                            prepared_dilation_width
                        {
                            object_writer.write::<_, _, 4>(&prepared_dilation_width);
                        }
                        if let ::core::option::Option::Some(prepared_group_input_channels) =
                            prepared_group_input_channels
                        {
                            object_writer.write::<_, _, 4>(&prepared_group_input_channels);
                        }
                        if let ::core::option::Option::Some(prepared_group_output_channels) =
                            prepared_group_output_channels
                        {
                            object_writer.write::<_, _, 4>(&prepared_group_output_channels);
                        }
                        if let ::core::option::Option::Some(prepared_groups) = prepared_groups {
                            object_writer.write::<_, _, 4>(&prepared_groups);
                        }
                        if let ::core::option::Option::Some(prepared_adjustment_height) =
                            prepared_adjustment_height
                        {
                            object_writer.write::<_, _, 4>(&prepared_adjustment_height);
                        }
                        if let ::core::option::Option::Some(prepared_adjustment_width) =
                            prepared_adjustment_width
                        {
                            object_writer.write::<_, _, 4>(&prepared_adjustment_width);
                        }
                        if let ::core::option::Option::Some(prepared_input1_id) = prepared_input1_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_input1_id);
                        }
                        if let ::core::option::Option::Some(prepared_filter_id) = prepared_filter_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_filter_id);
                        }
                        if let ::core::option::Option::Some(prepared_bias_id) = prepared_bias_id {
                            object_writer.write::<_, _, 4>(&prepared_bias_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnNodeConv>> for XnnNodeConv {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNodeConv> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnNodeConv>> for XnnNodeConv {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnNodeConv>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnNodeConv> for XnnNodeConv {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNodeConv> {
                XnnNodeConv::create(
                    builder,
                    self.padding_top,
                    self.padding_right,
                    self.padding_bottom,
                    self.padding_left,
                    self.kernel_height,
                    self.kernel_width,
                    self.subsampling_height,
                    self.subsampling_width,
                    self.dilation_height,
                    self.dilation_width,
                    self.group_input_channels,
                    self.group_output_channels,
                    self.groups,
                    self.adjustment_height,
                    self.adjustment_width,
                    self.input1_id,
                    self.filter_id,
                    self.bias_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnNodeConv] type.
        ///
        /// Can be created using the [XnnNodeConv::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnNodeConvBuilder<State>(State);

        impl XnnNodeConvBuilder<()> {
            /// Setter for the [`padding_top` field](XnnNodeConv#structfield.padding_top).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_top<T0>(self, value: T0) -> XnnNodeConvBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnNodeConvBuilder((value,))
            }

            /// Sets the [`padding_top` field](XnnNodeConv#structfield.padding_top) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_top_as_default(self) -> XnnNodeConvBuilder<(::planus::DefaultValue,)> {
                self.padding_top(::planus::DefaultValue)
            }
        }

        impl<T0> XnnNodeConvBuilder<(T0,)> {
            /// Setter for the [`padding_right` field](XnnNodeConv#structfield.padding_right).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_right<T1>(self, value: T1) -> XnnNodeConvBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnNodeConvBuilder((v0, value))
            }

            /// Sets the [`padding_right` field](XnnNodeConv#structfield.padding_right) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_right_as_default(
                self,
            ) -> XnnNodeConvBuilder<(T0, ::planus::DefaultValue)> {
                self.padding_right(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnNodeConvBuilder<(T0, T1)> {
            /// Setter for the [`padding_bottom` field](XnnNodeConv#structfield.padding_bottom).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_bottom<T2>(self, value: T2) -> XnnNodeConvBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnNodeConvBuilder((v0, v1, value))
            }

            /// Sets the [`padding_bottom` field](XnnNodeConv#structfield.padding_bottom) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_bottom_as_default(
                self,
            ) -> XnnNodeConvBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.padding_bottom(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnNodeConvBuilder<(T0, T1, T2)> {
            /// Setter for the [`padding_left` field](XnnNodeConv#structfield.padding_left).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_left<T3>(self, value: T3) -> XnnNodeConvBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, value))
            }

            /// Sets the [`padding_left` field](XnnNodeConv#structfield.padding_left) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_left_as_default(
                self,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.padding_left(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnNodeConvBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`kernel_height` field](XnnNodeConv#structfield.kernel_height).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn kernel_height<T4>(self, value: T4) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`kernel_height` field](XnnNodeConv#structfield.kernel_height) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn kernel_height_as_default(
                self,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.kernel_height(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnNodeConvBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`kernel_width` field](XnnNodeConv#structfield.kernel_width).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn kernel_width<T5>(self, value: T5) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`kernel_width` field](XnnNodeConv#structfield.kernel_width) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn kernel_width_as_default(
                self,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, ::planus::DefaultValue)> {
                self.kernel_width(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Setter for the [`subsampling_height` field](XnnNodeConv#structfield.subsampling_height).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn subsampling_height<T6>(
                self,
                value: T6,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6)>
            where
                T6: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, v3, v4, v5, value))
            }

            /// Sets the [`subsampling_height` field](XnnNodeConv#structfield.subsampling_height) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn subsampling_height_as_default(
                self,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, ::planus::DefaultValue)> {
                self.subsampling_height(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6)> {
            /// Setter for the [`subsampling_width` field](XnnNodeConv#structfield.subsampling_width).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn subsampling_width<T7>(
                self,
                value: T7,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
            where
                T7: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, v3, v4, v5, v6, value))
            }

            /// Sets the [`subsampling_width` field](XnnNodeConv#structfield.subsampling_width) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn subsampling_width_as_default(
                self,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, ::planus::DefaultValue)>
            {
                self.subsampling_width(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)> {
            /// Setter for the [`dilation_height` field](XnnNodeConv#structfield.dilation_height).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dilation_height<T8>(
                self,
                value: T8,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
            where
                T8: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, v3, v4, v5, v6, v7, value))
            }

            /// Sets the [`dilation_height` field](XnnNodeConv#structfield.dilation_height) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dilation_height_as_default(
                self,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, ::planus::DefaultValue)>
            {
                self.dilation_height(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)> {
            /// Setter for the [`dilation_width` field](XnnNodeConv#structfield.dilation_width).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dilation_width<T9>(
                self,
                value: T9,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
            where
                T9: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, value))
            }

            /// Sets the [`dilation_width` field](XnnNodeConv#structfield.dilation_width) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dilation_width_as_default(
                self,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, ::planus::DefaultValue)>
            {
                self.dilation_width(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9>
            XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            /// Setter for the [`group_input_channels` field](XnnNodeConv#structfield.group_input_channels).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn group_input_channels<T10>(
                self,
                value: T10,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10)>
            where
                T10: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, value))
            }

            /// Sets the [`group_input_channels` field](XnnNodeConv#structfield.group_input_channels) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn group_input_channels_as_default(
                self,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                ::planus::DefaultValue,
            )> {
                self.group_input_channels(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10>
            XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10)>
        {
            /// Setter for the [`group_output_channels` field](XnnNodeConv#structfield.group_output_channels).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn group_output_channels<T11>(
                self,
                value: T11,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11)>
            where
                T11: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, value))
            }

            /// Sets the [`group_output_channels` field](XnnNodeConv#structfield.group_output_channels) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn group_output_channels_as_default(
                self,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                ::planus::DefaultValue,
            )> {
                self.group_output_channels(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11>
            XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11)>
        {
            /// Setter for the [`groups` field](XnnNodeConv#structfield.groups).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn groups<T12>(
                self,
                value: T12,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12)>
            where
                T12: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, value))
            }

            /// Sets the [`groups` field](XnnNodeConv#structfield.groups) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn groups_as_default(
                self,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                ::planus::DefaultValue,
            )> {
                self.groups(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12>
            XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12)>
        {
            /// Setter for the [`adjustment_height` field](XnnNodeConv#structfield.adjustment_height).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn adjustment_height<T13>(
                self,
                value: T13,
            ) -> XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13)>
            where
                T13: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12) = self.0;
                XnnNodeConvBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, value))
            }

            /// Sets the [`adjustment_height` field](XnnNodeConv#structfield.adjustment_height) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn adjustment_height_as_default(
                self,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                ::planus::DefaultValue,
            )> {
                self.adjustment_height(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13>
            XnnNodeConvBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13)>
        {
            /// Setter for the [`adjustment_width` field](XnnNodeConv#structfield.adjustment_width).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn adjustment_width<T14>(
                self,
                value: T14,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
            )>
            where
                T14: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13) = self.0;
                XnnNodeConvBuilder((
                    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, value,
                ))
            }

            /// Sets the [`adjustment_width` field](XnnNodeConv#structfield.adjustment_width) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn adjustment_width_as_default(
                self,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                ::planus::DefaultValue,
            )> {
                self.adjustment_width(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13, T14>
            XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
            )>
        {
            /// Setter for the [`input1_id` field](XnnNodeConv#structfield.input1_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input1_id<T15>(
                self,
                value: T15,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
            )>
            where
                T15: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14) = self.0;
                XnnNodeConvBuilder((
                    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, value,
                ))
            }

            /// Sets the [`input1_id` field](XnnNodeConv#structfield.input1_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input1_id_as_default(
                self,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                ::planus::DefaultValue,
            )> {
                self.input1_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13, T14, T15>
            XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
            )>
        {
            /// Setter for the [`filter_id` field](XnnNodeConv#structfield.filter_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn filter_id<T16>(
                self,
                value: T16,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
            )>
            where
                T16: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15) = self.0;
                XnnNodeConvBuilder((
                    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, value,
                ))
            }

            /// Sets the [`filter_id` field](XnnNodeConv#structfield.filter_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn filter_id_as_default(
                self,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                ::planus::DefaultValue,
            )> {
                self.filter_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13, T14, T15, T16>
            XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
            )>
        {
            /// Setter for the [`bias_id` field](XnnNodeConv#structfield.bias_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn bias_id<T17>(
                self,
                value: T17,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
            )>
            where
                T17: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, v16) =
                    self.0;
                XnnNodeConvBuilder((
                    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, v16,
                    value,
                ))
            }

            /// Sets the [`bias_id` field](XnnNodeConv#structfield.bias_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn bias_id_as_default(
                self,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                ::planus::DefaultValue,
            )> {
                self.bias_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12, T13, T14, T15, T16, T17>
            XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
            )>
        {
            /// Setter for the [`output_id` field](XnnNodeConv#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T18>(
                self,
                value: T18,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                T18,
            )>
            where
                T18: ::planus::WriteAsDefault<u32, u32>,
            {
                let (
                    v0,
                    v1,
                    v2,
                    v3,
                    v4,
                    v5,
                    v6,
                    v7,
                    v8,
                    v9,
                    v10,
                    v11,
                    v12,
                    v13,
                    v14,
                    v15,
                    v16,
                    v17,
                ) = self.0;
                XnnNodeConvBuilder((
                    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, v16, v17,
                    value,
                ))
            }

            /// Sets the [`output_id` field](XnnNodeConv#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                ::planus::DefaultValue,
            )> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                T18,
            >
            XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                T18,
            )>
        {
            /// Setter for the [`flags` field](XnnNodeConv#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T19>(
                self,
                value: T19,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                T18,
                T19,
            )>
            where
                T19: ::planus::WriteAsDefault<u32, u32>,
            {
                let (
                    v0,
                    v1,
                    v2,
                    v3,
                    v4,
                    v5,
                    v6,
                    v7,
                    v8,
                    v9,
                    v10,
                    v11,
                    v12,
                    v13,
                    v14,
                    v15,
                    v16,
                    v17,
                    v18,
                ) = self.0;
                XnnNodeConvBuilder((
                    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, v16, v17,
                    v18, value,
                ))
            }

            /// Sets the [`flags` field](XnnNodeConv#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                T18,
                ::planus::DefaultValue,
            )> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                T18,
                T19,
            >
            XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                T18,
                T19,
            )>
        {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnNodeConv].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNodeConv>
            where
                Self: ::planus::WriteAsOffset<XnnNodeConv>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
                T8: ::planus::WriteAsDefault<u32, u32>,
                T9: ::planus::WriteAsDefault<u32, u32>,
                T10: ::planus::WriteAsDefault<u32, u32>,
                T11: ::planus::WriteAsDefault<u32, u32>,
                T12: ::planus::WriteAsDefault<u32, u32>,
                T13: ::planus::WriteAsDefault<u32, u32>,
                T14: ::planus::WriteAsDefault<u32, u32>,
                T15: ::planus::WriteAsDefault<u32, u32>,
                T16: ::planus::WriteAsDefault<u32, u32>,
                T17: ::planus::WriteAsDefault<u32, u32>,
                T18: ::planus::WriteAsDefault<u32, u32>,
                T19: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnNodeConv>>
            for XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                T18,
                T19,
            )>
        {
            type Prepared = ::planus::Offset<XnnNodeConv>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNodeConv> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
                T8: ::planus::WriteAsDefault<u32, u32>,
                T9: ::planus::WriteAsDefault<u32, u32>,
                T10: ::planus::WriteAsDefault<u32, u32>,
                T11: ::planus::WriteAsDefault<u32, u32>,
                T12: ::planus::WriteAsDefault<u32, u32>,
                T13: ::planus::WriteAsDefault<u32, u32>,
                T14: ::planus::WriteAsDefault<u32, u32>,
                T15: ::planus::WriteAsDefault<u32, u32>,
                T16: ::planus::WriteAsDefault<u32, u32>,
                T17: ::planus::WriteAsDefault<u32, u32>,
                T18: ::planus::WriteAsDefault<u32, u32>,
                T19: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnNodeConv>>
            for XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                T18,
                T19,
            )>
        {
            type Prepared = ::planus::Offset<XnnNodeConv>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnNodeConv>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
                T8: ::planus::WriteAsDefault<u32, u32>,
                T9: ::planus::WriteAsDefault<u32, u32>,
                T10: ::planus::WriteAsDefault<u32, u32>,
                T11: ::planus::WriteAsDefault<u32, u32>,
                T12: ::planus::WriteAsDefault<u32, u32>,
                T13: ::planus::WriteAsDefault<u32, u32>,
                T14: ::planus::WriteAsDefault<u32, u32>,
                T15: ::planus::WriteAsDefault<u32, u32>,
                T16: ::planus::WriteAsDefault<u32, u32>,
                T17: ::planus::WriteAsDefault<u32, u32>,
                T18: ::planus::WriteAsDefault<u32, u32>,
                T19: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnNodeConv>
            for XnnNodeConvBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                T12,
                T13,
                T14,
                T15,
                T16,
                T17,
                T18,
                T19,
            )>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnNodeConv> {
                let (
                    v0,
                    v1,
                    v2,
                    v3,
                    v4,
                    v5,
                    v6,
                    v7,
                    v8,
                    v9,
                    v10,
                    v11,
                    v12,
                    v13,
                    v14,
                    v15,
                    v16,
                    v17,
                    v18,
                    v19,
                ) = &self.0;
                XnnNodeConv::create(
                    builder, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
                    v16, v17, v18, v19,
                )
            }
        }

        /// Reference to a deserialized [XnnNodeConv].
        #[derive(Copy, Clone)]
        pub struct XnnNodeConvRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnNodeConvRef<'a> {
            /// Getter for the [`padding_top` field](XnnNodeConv#structfield.padding_top).
            #[inline]
            pub fn padding_top(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(0, "XnnNodeConv", "padding_top")?.unwrap_or(0),
                )
            }

            /// Getter for the [`padding_right` field](XnnNodeConv#structfield.padding_right).
            #[inline]
            pub fn padding_right(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "XnnNodeConv", "padding_right")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`padding_bottom` field](XnnNodeConv#structfield.padding_bottom).
            #[inline]
            pub fn padding_bottom(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "XnnNodeConv", "padding_bottom")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`padding_left` field](XnnNodeConv#structfield.padding_left).
            #[inline]
            pub fn padding_left(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "XnnNodeConv", "padding_left")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`kernel_height` field](XnnNodeConv#structfield.kernel_height).
            #[inline]
            pub fn kernel_height(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "XnnNodeConv", "kernel_height")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`kernel_width` field](XnnNodeConv#structfield.kernel_width).
            #[inline]
            pub fn kernel_width(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(5, "XnnNodeConv", "kernel_width")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`subsampling_height` field](XnnNodeConv#structfield.subsampling_height).
            #[inline]
            pub fn subsampling_height(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(6, "XnnNodeConv", "subsampling_height")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`subsampling_width` field](XnnNodeConv#structfield.subsampling_width).
            #[inline]
            pub fn subsampling_width(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(7, "XnnNodeConv", "subsampling_width")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`dilation_height` field](XnnNodeConv#structfield.dilation_height).
            #[inline]
            pub fn dilation_height(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(8, "XnnNodeConv", "dilation_height")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`dilation_width` field](XnnNodeConv#structfield.dilation_width).
            #[inline]
            pub fn dilation_width(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(9, "XnnNodeConv", "dilation_width")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`group_input_channels` field](XnnNodeConv#structfield.group_input_channels).
            #[inline]
            pub fn group_input_channels(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(10, "XnnNodeConv", "group_input_channels")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`group_output_channels` field](XnnNodeConv#structfield.group_output_channels).
            #[inline]
            pub fn group_output_channels(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(11, "XnnNodeConv", "group_output_channels")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`groups` field](XnnNodeConv#structfield.groups).
            #[inline]
            pub fn groups(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(12, "XnnNodeConv", "groups")?.unwrap_or(0))
            }

            /// Getter for the [`adjustment_height` field](XnnNodeConv#structfield.adjustment_height).
            #[inline]
            pub fn adjustment_height(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(13, "XnnNodeConv", "adjustment_height")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`adjustment_width` field](XnnNodeConv#structfield.adjustment_width).
            #[inline]
            pub fn adjustment_width(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(14, "XnnNodeConv", "adjustment_width")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`input1_id` field](XnnNodeConv#structfield.input1_id).
            #[inline]
            pub fn input1_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(15, "XnnNodeConv", "input1_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`filter_id` field](XnnNodeConv#structfield.filter_id).
            #[inline]
            pub fn filter_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(16, "XnnNodeConv", "filter_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`bias_id` field](XnnNodeConv#structfield.bias_id).
            #[inline]
            pub fn bias_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(17, "XnnNodeConv", "bias_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnNodeConv#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(18, "XnnNodeConv", "output_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnNodeConv#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(19, "XnnNodeConv", "flags")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for XnnNodeConvRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnNodeConvRef");
                f.field("padding_top", &self.padding_top());
                f.field("padding_right", &self.padding_right());
                f.field("padding_bottom", &self.padding_bottom());
                f.field("padding_left", &self.padding_left());
                f.field("kernel_height", &self.kernel_height());
                f.field("kernel_width", &self.kernel_width());
                f.field("subsampling_height", &self.subsampling_height());
                f.field("subsampling_width", &self.subsampling_width());
                f.field("dilation_height", &self.dilation_height());
                f.field("dilation_width", &self.dilation_width());
                f.field("group_input_channels", &self.group_input_channels());
                f.field("group_output_channels", &self.group_output_channels());
                f.field("groups", &self.groups());
                f.field("adjustment_height", &self.adjustment_height());
                f.field("adjustment_width", &self.adjustment_width());
                f.field("input1_id", &self.input1_id());
                f.field("filter_id", &self.filter_id());
                f.field("bias_id", &self.bias_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnNodeConvRef<'a>> for XnnNodeConv {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnNodeConvRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    padding_top: ::core::convert::TryInto::try_into(value.padding_top()?)?,
                    padding_right: ::core::convert::TryInto::try_into(value.padding_right()?)?,
                    padding_bottom: ::core::convert::TryInto::try_into(value.padding_bottom()?)?,
                    padding_left: ::core::convert::TryInto::try_into(value.padding_left()?)?,
                    kernel_height: ::core::convert::TryInto::try_into(value.kernel_height()?)?,
                    kernel_width: ::core::convert::TryInto::try_into(value.kernel_width()?)?,
                    subsampling_height: ::core::convert::TryInto::try_into(
                        value.subsampling_height()?,
                    )?,
                    subsampling_width: ::core::convert::TryInto::try_into(
                        value.subsampling_width()?,
                    )?,
                    dilation_height: ::core::convert::TryInto::try_into(value.dilation_height()?)?,
                    dilation_width: ::core::convert::TryInto::try_into(value.dilation_width()?)?,
                    group_input_channels: ::core::convert::TryInto::try_into(
                        value.group_input_channels()?,
                    )?,
                    group_output_channels: ::core::convert::TryInto::try_into(
                        value.group_output_channels()?,
                    )?,
                    groups: ::core::convert::TryInto::try_into(value.groups()?)?,
                    adjustment_height: ::core::convert::TryInto::try_into(
                        value.adjustment_height()?,
                    )?,
                    adjustment_width: ::core::convert::TryInto::try_into(
                        value.adjustment_width()?,
                    )?,
                    input1_id: ::core::convert::TryInto::try_into(value.input1_id()?)?,
                    filter_id: ::core::convert::TryInto::try_into(value.filter_id()?)?,
                    bias_id: ::core::convert::TryInto::try_into(value.bias_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnNodeConvRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnNodeConvRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnNodeConvRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnNodeConv>> for XnnNodeConv {
            type Value = ::planus::Offset<XnnNodeConv>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnNodeConv>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnNodeConvRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnNodeConvRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `_XNNPooling2D` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `_XNNPooling2D` in the file `schema/xnnpack.fbs:277`
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
        pub struct XnnPooling2D {
            /// The field `padding_top` in the table `_XNNPooling2D`
            pub padding_top: u32,
            /// The field `padding_right` in the table `_XNNPooling2D`
            pub padding_right: u32,
            /// The field `padding_bottom` in the table `_XNNPooling2D`
            pub padding_bottom: u32,
            /// The field `padding_left` in the table `_XNNPooling2D`
            pub padding_left: u32,
            /// The field `pooling_height` in the table `_XNNPooling2D`
            pub pooling_height: u32,
            /// The field `pooling_width` in the table `_XNNPooling2D`
            pub pooling_width: u32,
            /// The field `stride_height` in the table `_XNNPooling2D`
            pub stride_height: u32,
            /// The field `stride_width` in the table `_XNNPooling2D`
            pub stride_width: u32,
            /// The field `dilation_height` in the table `_XNNPooling2D`
            pub dilation_height: u32,
            /// The field `dilation_width` in the table `_XNNPooling2D`
            pub dilation_width: u32,
            /// The field `input_id` in the table `_XNNPooling2D`
            pub input_id: u32,
            /// The field `output_id` in the table `_XNNPooling2D`
            pub output_id: u32,
            /// The field `flags` in the table `_XNNPooling2D`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnPooling2D {
            fn default() -> Self {
                Self {
                    padding_top: 0,
                    padding_right: 0,
                    padding_bottom: 0,
                    padding_left: 0,
                    pooling_height: 0,
                    pooling_width: 0,
                    stride_height: 0,
                    stride_width: 0,
                    dilation_height: 0,
                    dilation_width: 0,
                    input_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnPooling2D {
            /// Creates a [XnnPooling2DBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnPooling2DBuilder<()> {
                XnnPooling2DBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_padding_top: impl ::planus::WriteAsDefault<u32, u32>,
                field_padding_right: impl ::planus::WriteAsDefault<u32, u32>,
                field_padding_bottom: impl ::planus::WriteAsDefault<u32, u32>,
                field_padding_left: impl ::planus::WriteAsDefault<u32, u32>,
                field_pooling_height: impl ::planus::WriteAsDefault<u32, u32>,
                field_pooling_width: impl ::planus::WriteAsDefault<u32, u32>,
                field_stride_height: impl ::planus::WriteAsDefault<u32, u32>,
                field_stride_width: impl ::planus::WriteAsDefault<u32, u32>,
                field_dilation_height: impl ::planus::WriteAsDefault<u32, u32>,
                field_dilation_width: impl ::planus::WriteAsDefault<u32, u32>,
                field_input_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_padding_top = field_padding_top.prepare(builder, &0);
                let prepared_padding_right = field_padding_right.prepare(builder, &0);
                let prepared_padding_bottom = field_padding_bottom.prepare(builder, &0);
                let prepared_padding_left = field_padding_left.prepare(builder, &0);
                let prepared_pooling_height = field_pooling_height.prepare(builder, &0);
                let prepared_pooling_width = field_pooling_width.prepare(builder, &0);
                let prepared_stride_height = field_stride_height.prepare(builder, &0);
                let prepared_stride_width = field_stride_width.prepare(builder, &0);
                let prepared_dilation_height = field_dilation_height.prepare(builder, &0);
                let prepared_dilation_width = field_dilation_width.prepare(builder, &0);
                let prepared_input_id = field_input_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<30> =
                    ::core::default::Default::default();
                if prepared_padding_top.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_padding_right.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_padding_bottom.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_padding_left.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_pooling_height.is_some() {
                    table_writer.write_entry::<u32>(4);
                }
                if prepared_pooling_width.is_some() {
                    table_writer.write_entry::<u32>(5);
                }
                if prepared_stride_height.is_some() {
                    table_writer.write_entry::<u32>(6);
                }
                if prepared_stride_width.is_some() {
                    table_writer.write_entry::<u32>(7);
                }
                if prepared_dilation_height.is_some() {
                    table_writer.write_entry::<u32>(8);
                }
                if prepared_dilation_width.is_some() {
                    table_writer.write_entry::<u32>(9);
                }
                if prepared_input_id.is_some() {
                    table_writer.write_entry::<u32>(10);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(11);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(12);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_padding_top) =
                            prepared_padding_top
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_top);
                        }
                        if let ::core::option::Option::Some(prepared_padding_right) =
                            prepared_padding_right
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_right);
                        }
                        if let ::core::option::Option::Some(prepared_padding_bottom) =
                            prepared_padding_bottom
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_bottom);
                        }
                        if let ::core::option::Option::Some(prepared_padding_left) =
                            prepared_padding_left
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_left);
                        }
                        if let ::core::option::Option::Some(prepared_pooling_height) =
                            prepared_pooling_height
                        {
                            object_writer.write::<_, _, 4>(&prepared_pooling_height);
                        }
                        if let ::core::option::Option::Some(prepared_pooling_width) =
                            prepared_pooling_width
                        {
                            object_writer.write::<_, _, 4>(&prepared_pooling_width);
                        }
                        if let ::core::option::Option::Some(prepared_stride_height) =
                            prepared_stride_height
                        {
                            object_writer.write::<_, _, 4>(&prepared_stride_height);
                        }
                        if let ::core::option::Option::Some(prepared_stride_width) =
                            prepared_stride_width
                        {
                            object_writer.write::<_, _, 4>(&prepared_stride_width);
                        }
                        if let ::core::option::Option::Some(prepared_dilation_height) =
                            prepared_dilation_height
                        {
                            object_writer.write::<_, _, 4>(&prepared_dilation_height);
                        }
                        if let ::core::option::Option::Some(prepared_dilation_width) =
                            prepared_dilation_width
                        {
                            object_writer.write::<_, _, 4>(&prepared_dilation_width);
                        }
                        if let ::core::option::Option::Some(prepared_input_id) = prepared_input_id {
                            object_writer.write::<_, _, 4>(&prepared_input_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnPooling2D>> for XnnPooling2D {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnPooling2D> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnPooling2D>> for XnnPooling2D {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnPooling2D>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnPooling2D> for XnnPooling2D {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnPooling2D> {
                XnnPooling2D::create(
                    builder,
                    self.padding_top,
                    self.padding_right,
                    self.padding_bottom,
                    self.padding_left,
                    self.pooling_height,
                    self.pooling_width,
                    self.stride_height,
                    self.stride_width,
                    self.dilation_height,
                    self.dilation_width,
                    self.input_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnPooling2D] type.
        ///
        /// Can be created using the [XnnPooling2D::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnPooling2DBuilder<State>(State);

        impl XnnPooling2DBuilder<()> {
            /// Setter for the [`padding_top` field](XnnPooling2D#structfield.padding_top).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_top<T0>(self, value: T0) -> XnnPooling2DBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnPooling2DBuilder((value,))
            }

            /// Sets the [`padding_top` field](XnnPooling2D#structfield.padding_top) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_top_as_default(self) -> XnnPooling2DBuilder<(::planus::DefaultValue,)> {
                self.padding_top(::planus::DefaultValue)
            }
        }

        impl<T0> XnnPooling2DBuilder<(T0,)> {
            /// Setter for the [`padding_right` field](XnnPooling2D#structfield.padding_right).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_right<T1>(self, value: T1) -> XnnPooling2DBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnPooling2DBuilder((v0, value))
            }

            /// Sets the [`padding_right` field](XnnPooling2D#structfield.padding_right) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_right_as_default(
                self,
            ) -> XnnPooling2DBuilder<(T0, ::planus::DefaultValue)> {
                self.padding_right(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnPooling2DBuilder<(T0, T1)> {
            /// Setter for the [`padding_bottom` field](XnnPooling2D#structfield.padding_bottom).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_bottom<T2>(self, value: T2) -> XnnPooling2DBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnPooling2DBuilder((v0, v1, value))
            }

            /// Sets the [`padding_bottom` field](XnnPooling2D#structfield.padding_bottom) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_bottom_as_default(
                self,
            ) -> XnnPooling2DBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.padding_bottom(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnPooling2DBuilder<(T0, T1, T2)> {
            /// Setter for the [`padding_left` field](XnnPooling2D#structfield.padding_left).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_left<T3>(self, value: T3) -> XnnPooling2DBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnPooling2DBuilder((v0, v1, v2, value))
            }

            /// Sets the [`padding_left` field](XnnPooling2D#structfield.padding_left) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_left_as_default(
                self,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.padding_left(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnPooling2DBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`pooling_height` field](XnnPooling2D#structfield.pooling_height).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn pooling_height<T4>(self, value: T4) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnPooling2DBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`pooling_height` field](XnnPooling2D#structfield.pooling_height) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn pooling_height_as_default(
                self,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.pooling_height(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnPooling2DBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`pooling_width` field](XnnPooling2D#structfield.pooling_width).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn pooling_width<T5>(
                self,
                value: T5,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                XnnPooling2DBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`pooling_width` field](XnnPooling2D#structfield.pooling_width) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn pooling_width_as_default(
                self,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, ::planus::DefaultValue)> {
                self.pooling_width(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Setter for the [`stride_height` field](XnnPooling2D#structfield.stride_height).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn stride_height<T6>(
                self,
                value: T6,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6)>
            where
                T6: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5) = self.0;
                XnnPooling2DBuilder((v0, v1, v2, v3, v4, v5, value))
            }

            /// Sets the [`stride_height` field](XnnPooling2D#structfield.stride_height) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn stride_height_as_default(
                self,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, ::planus::DefaultValue)> {
                self.stride_height(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6)> {
            /// Setter for the [`stride_width` field](XnnPooling2D#structfield.stride_width).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn stride_width<T7>(
                self,
                value: T7,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
            where
                T7: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6) = self.0;
                XnnPooling2DBuilder((v0, v1, v2, v3, v4, v5, v6, value))
            }

            /// Sets the [`stride_width` field](XnnPooling2D#structfield.stride_width) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn stride_width_as_default(
                self,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, ::planus::DefaultValue)>
            {
                self.stride_width(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)> {
            /// Setter for the [`dilation_height` field](XnnPooling2D#structfield.dilation_height).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dilation_height<T8>(
                self,
                value: T8,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
            where
                T8: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7) = self.0;
                XnnPooling2DBuilder((v0, v1, v2, v3, v4, v5, v6, v7, value))
            }

            /// Sets the [`dilation_height` field](XnnPooling2D#structfield.dilation_height) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dilation_height_as_default(
                self,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, ::planus::DefaultValue)>
            {
                self.dilation_height(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)> {
            /// Setter for the [`dilation_width` field](XnnPooling2D#structfield.dilation_width).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dilation_width<T9>(
                self,
                value: T9,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
            where
                T9: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8) = self.0;
                XnnPooling2DBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, value))
            }

            /// Sets the [`dilation_width` field](XnnPooling2D#structfield.dilation_width) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn dilation_width_as_default(
                self,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, ::planus::DefaultValue)>
            {
                self.dilation_width(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9>
            XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            /// Setter for the [`input_id` field](XnnPooling2D#structfield.input_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id<T10>(
                self,
                value: T10,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10)>
            where
                T10: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9) = self.0;
                XnnPooling2DBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, value))
            }

            /// Sets the [`input_id` field](XnnPooling2D#structfield.input_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id_as_default(
                self,
            ) -> XnnPooling2DBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                ::planus::DefaultValue,
            )> {
                self.input_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10>
            XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10)>
        {
            /// Setter for the [`output_id` field](XnnPooling2D#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T11>(
                self,
                value: T11,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11)>
            where
                T11: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10) = self.0;
                XnnPooling2DBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, value))
            }

            /// Sets the [`output_id` field](XnnPooling2D#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnPooling2DBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                ::planus::DefaultValue,
            )> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11>
            XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11)>
        {
            /// Setter for the [`flags` field](XnnPooling2D#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T12>(
                self,
                value: T12,
            ) -> XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12)>
            where
                T12: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11) = self.0;
                XnnPooling2DBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, value))
            }

            /// Sets the [`flags` field](XnnPooling2D#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnPooling2DBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                T9,
                T10,
                T11,
                ::planus::DefaultValue,
            )> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12>
            XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12)>
        {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnPooling2D].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnPooling2D>
            where
                Self: ::planus::WriteAsOffset<XnnPooling2D>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
                T8: ::planus::WriteAsDefault<u32, u32>,
                T9: ::planus::WriteAsDefault<u32, u32>,
                T10: ::planus::WriteAsDefault<u32, u32>,
                T11: ::planus::WriteAsDefault<u32, u32>,
                T12: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnPooling2D>>
            for XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12)>
        {
            type Prepared = ::planus::Offset<XnnPooling2D>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnPooling2D> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
                T8: ::planus::WriteAsDefault<u32, u32>,
                T9: ::planus::WriteAsDefault<u32, u32>,
                T10: ::planus::WriteAsDefault<u32, u32>,
                T11: ::planus::WriteAsDefault<u32, u32>,
                T12: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnPooling2D>>
            for XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12)>
        {
            type Prepared = ::planus::Offset<XnnPooling2D>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnPooling2D>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
                T8: ::planus::WriteAsDefault<u32, u32>,
                T9: ::planus::WriteAsDefault<u32, u32>,
                T10: ::planus::WriteAsDefault<u32, u32>,
                T11: ::planus::WriteAsDefault<u32, u32>,
                T12: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnPooling2D>
            for XnnPooling2DBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnPooling2D> {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12) = &self.0;
                XnnPooling2D::create(
                    builder, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12,
                )
            }
        }

        /// Reference to a deserialized [XnnPooling2D].
        #[derive(Copy, Clone)]
        pub struct XnnPooling2DRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnPooling2DRef<'a> {
            /// Getter for the [`padding_top` field](XnnPooling2D#structfield.padding_top).
            #[inline]
            pub fn padding_top(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "XnnPooling2D", "padding_top")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`padding_right` field](XnnPooling2D#structfield.padding_right).
            #[inline]
            pub fn padding_right(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "XnnPooling2D", "padding_right")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`padding_bottom` field](XnnPooling2D#structfield.padding_bottom).
            #[inline]
            pub fn padding_bottom(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "XnnPooling2D", "padding_bottom")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`padding_left` field](XnnPooling2D#structfield.padding_left).
            #[inline]
            pub fn padding_left(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "XnnPooling2D", "padding_left")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`pooling_height` field](XnnPooling2D#structfield.pooling_height).
            #[inline]
            pub fn pooling_height(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "XnnPooling2D", "pooling_height")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`pooling_width` field](XnnPooling2D#structfield.pooling_width).
            #[inline]
            pub fn pooling_width(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(5, "XnnPooling2D", "pooling_width")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`stride_height` field](XnnPooling2D#structfield.stride_height).
            #[inline]
            pub fn stride_height(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(6, "XnnPooling2D", "stride_height")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`stride_width` field](XnnPooling2D#structfield.stride_width).
            #[inline]
            pub fn stride_width(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(7, "XnnPooling2D", "stride_width")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`dilation_height` field](XnnPooling2D#structfield.dilation_height).
            #[inline]
            pub fn dilation_height(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(8, "XnnPooling2D", "dilation_height")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`dilation_width` field](XnnPooling2D#structfield.dilation_width).
            #[inline]
            pub fn dilation_width(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(9, "XnnPooling2D", "dilation_width")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`input_id` field](XnnPooling2D#structfield.input_id).
            #[inline]
            pub fn input_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(10, "XnnPooling2D", "input_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnPooling2D#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(11, "XnnPooling2D", "output_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnPooling2D#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(12, "XnnPooling2D", "flags")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for XnnPooling2DRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnPooling2DRef");
                f.field("padding_top", &self.padding_top());
                f.field("padding_right", &self.padding_right());
                f.field("padding_bottom", &self.padding_bottom());
                f.field("padding_left", &self.padding_left());
                f.field("pooling_height", &self.pooling_height());
                f.field("pooling_width", &self.pooling_width());
                f.field("stride_height", &self.stride_height());
                f.field("stride_width", &self.stride_width());
                f.field("dilation_height", &self.dilation_height());
                f.field("dilation_width", &self.dilation_width());
                f.field("input_id", &self.input_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnPooling2DRef<'a>> for XnnPooling2D {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnPooling2DRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    padding_top: ::core::convert::TryInto::try_into(value.padding_top()?)?,
                    padding_right: ::core::convert::TryInto::try_into(value.padding_right()?)?,
                    padding_bottom: ::core::convert::TryInto::try_into(value.padding_bottom()?)?,
                    padding_left: ::core::convert::TryInto::try_into(value.padding_left()?)?,
                    pooling_height: ::core::convert::TryInto::try_into(value.pooling_height()?)?,
                    pooling_width: ::core::convert::TryInto::try_into(value.pooling_width()?)?,
                    stride_height: ::core::convert::TryInto::try_into(value.stride_height()?)?,
                    stride_width: ::core::convert::TryInto::try_into(value.stride_width()?)?,
                    dilation_height: ::core::convert::TryInto::try_into(value.dilation_height()?)?,
                    dilation_width: ::core::convert::TryInto::try_into(value.dilation_width()?)?,
                    input_id: ::core::convert::TryInto::try_into(value.input_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnPooling2DRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnPooling2DRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnPooling2DRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnPooling2D>> for XnnPooling2D {
            type Value = ::planus::Offset<XnnPooling2D>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnPooling2D>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnPooling2DRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnPooling2DRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNStaticReshape` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNStaticReshape` in the file `schema/xnnpack.fbs:293`
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
        pub struct XnnStaticReshape {
            /// The field `num_dims` in the table `XNNStaticReshape`
            pub num_dims: u32,
            /// The field `new_shape` in the table `XNNStaticReshape`
            pub new_shape: ::core::option::Option<::planus::alloc::vec::Vec<u32>>,
            /// The field `input_id` in the table `XNNStaticReshape`
            pub input_id: u32,
            /// The field `output_id` in the table `XNNStaticReshape`
            pub output_id: u32,
            /// The field `flags` in the table `XNNStaticReshape`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnStaticReshape {
            fn default() -> Self {
                Self {
                    num_dims: 0,
                    new_shape: ::core::default::Default::default(),
                    input_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnStaticReshape {
            /// Creates a [XnnStaticReshapeBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnStaticReshapeBuilder<()> {
                XnnStaticReshapeBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_num_dims: impl ::planus::WriteAsDefault<u32, u32>,
                field_new_shape: impl ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                field_input_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_num_dims = field_num_dims.prepare(builder, &0);
                let prepared_new_shape = field_new_shape.prepare(builder);
                let prepared_input_id = field_input_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<14> =
                    ::core::default::Default::default();
                if prepared_num_dims.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_new_shape.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u32]>>(1);
                }
                if prepared_input_id.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(4);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_num_dims) = prepared_num_dims {
                            object_writer.write::<_, _, 4>(&prepared_num_dims);
                        }
                        if let ::core::option::Option::Some(prepared_new_shape) = prepared_new_shape
                        {
                            object_writer.write::<_, _, 4>(&prepared_new_shape);
                        }
                        if let ::core::option::Option::Some(prepared_input_id) = prepared_input_id {
                            object_writer.write::<_, _, 4>(&prepared_input_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnStaticReshape>> for XnnStaticReshape {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticReshape> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnStaticReshape>> for XnnStaticReshape {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnStaticReshape>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnStaticReshape> for XnnStaticReshape {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticReshape> {
                XnnStaticReshape::create(
                    builder,
                    self.num_dims,
                    &self.new_shape,
                    self.input_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnStaticReshape] type.
        ///
        /// Can be created using the [XnnStaticReshape::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnStaticReshapeBuilder<State>(State);

        impl XnnStaticReshapeBuilder<()> {
            /// Setter for the [`num_dims` field](XnnStaticReshape#structfield.num_dims).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_dims<T0>(self, value: T0) -> XnnStaticReshapeBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnStaticReshapeBuilder((value,))
            }

            /// Sets the [`num_dims` field](XnnStaticReshape#structfield.num_dims) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_dims_as_default(self) -> XnnStaticReshapeBuilder<(::planus::DefaultValue,)> {
                self.num_dims(::planus::DefaultValue)
            }
        }

        impl<T0> XnnStaticReshapeBuilder<(T0,)> {
            /// Setter for the [`new_shape` field](XnnStaticReshape#structfield.new_shape).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn new_shape<T1>(self, value: T1) -> XnnStaticReshapeBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
            {
                let (v0,) = self.0;
                XnnStaticReshapeBuilder((v0, value))
            }

            /// Sets the [`new_shape` field](XnnStaticReshape#structfield.new_shape) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn new_shape_as_null(self) -> XnnStaticReshapeBuilder<(T0, ())> {
                self.new_shape(())
            }
        }

        impl<T0, T1> XnnStaticReshapeBuilder<(T0, T1)> {
            /// Setter for the [`input_id` field](XnnStaticReshape#structfield.input_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id<T2>(self, value: T2) -> XnnStaticReshapeBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnStaticReshapeBuilder((v0, v1, value))
            }

            /// Sets the [`input_id` field](XnnStaticReshape#structfield.input_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id_as_default(
                self,
            ) -> XnnStaticReshapeBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.input_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnStaticReshapeBuilder<(T0, T1, T2)> {
            /// Setter for the [`output_id` field](XnnStaticReshape#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T3>(self, value: T3) -> XnnStaticReshapeBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnStaticReshapeBuilder((v0, v1, v2, value))
            }

            /// Sets the [`output_id` field](XnnStaticReshape#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnStaticReshapeBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnStaticReshapeBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`flags` field](XnnStaticReshape#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T4>(self, value: T4) -> XnnStaticReshapeBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnStaticReshapeBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`flags` field](XnnStaticReshape#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnStaticReshapeBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnStaticReshapeBuilder<(T0, T1, T2, T3, T4)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnStaticReshape].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticReshape>
            where
                Self: ::planus::WriteAsOffset<XnnStaticReshape>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnStaticReshape>>
            for XnnStaticReshapeBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<XnnStaticReshape>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticReshape> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnStaticReshape>>
            for XnnStaticReshapeBuilder<(T0, T1, T2, T3, T4)>
        {
            type Prepared = ::planus::Offset<XnnStaticReshape>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnStaticReshape>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnStaticReshape>
            for XnnStaticReshapeBuilder<(T0, T1, T2, T3, T4)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnStaticReshape> {
                let (v0, v1, v2, v3, v4) = &self.0;
                XnnStaticReshape::create(builder, v0, v1, v2, v3, v4)
            }
        }

        /// Reference to a deserialized [XnnStaticReshape].
        #[derive(Copy, Clone)]
        pub struct XnnStaticReshapeRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnStaticReshapeRef<'a> {
            /// Getter for the [`num_dims` field](XnnStaticReshape#structfield.num_dims).
            #[inline]
            pub fn num_dims(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "XnnStaticReshape", "num_dims")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`new_shape` field](XnnStaticReshape#structfield.new_shape).
            #[inline]
            pub fn new_shape(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u32>>> {
                self.0.access(1, "XnnStaticReshape", "new_shape")
            }

            /// Getter for the [`input_id` field](XnnStaticReshape#structfield.input_id).
            #[inline]
            pub fn input_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "XnnStaticReshape", "input_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnStaticReshape#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "XnnStaticReshape", "output_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnStaticReshape#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(4, "XnnStaticReshape", "flags")?.unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for XnnStaticReshapeRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnStaticReshapeRef");
                f.field("num_dims", &self.num_dims());
                if let ::core::option::Option::Some(field_new_shape) = self.new_shape().transpose()
                {
                    f.field("new_shape", &field_new_shape);
                }
                f.field("input_id", &self.input_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnStaticReshapeRef<'a>> for XnnStaticReshape {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnStaticReshapeRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    num_dims: ::core::convert::TryInto::try_into(value.num_dims()?)?,
                    new_shape: if let ::core::option::Option::Some(new_shape) = value.new_shape()? {
                        ::core::option::Option::Some(new_shape.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    input_id: ::core::convert::TryInto::try_into(value.input_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnStaticReshapeRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnStaticReshapeRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnStaticReshapeRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnStaticReshape>> for XnnStaticReshape {
            type Value = ::planus::Offset<XnnStaticReshape>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnStaticReshape>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnStaticReshapeRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnStaticReshapeRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNStaticSlice` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNStaticSlice` in the file `schema/xnnpack.fbs:301`
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
        pub struct XnnStaticSlice {
            /// The field `num_dims` in the table `XNNStaticSlice`
            pub num_dims: u32,
            /// The field `offsets` in the table `XNNStaticSlice`
            pub offsets: ::core::option::Option<::planus::alloc::vec::Vec<u32>>,
            /// The field `sizes` in the table `XNNStaticSlice`
            pub sizes: ::core::option::Option<::planus::alloc::vec::Vec<u32>>,
            /// The field `input_id` in the table `XNNStaticSlice`
            pub input_id: u32,
            /// The field `output_id` in the table `XNNStaticSlice`
            pub output_id: u32,
            /// The field `flags` in the table `XNNStaticSlice`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnStaticSlice {
            fn default() -> Self {
                Self {
                    num_dims: 0,
                    offsets: ::core::default::Default::default(),
                    sizes: ::core::default::Default::default(),
                    input_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnStaticSlice {
            /// Creates a [XnnStaticSliceBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnStaticSliceBuilder<()> {
                XnnStaticSliceBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_num_dims: impl ::planus::WriteAsDefault<u32, u32>,
                field_offsets: impl ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                field_sizes: impl ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                field_input_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_num_dims = field_num_dims.prepare(builder, &0);
                let prepared_offsets = field_offsets.prepare(builder);
                let prepared_sizes = field_sizes.prepare(builder);
                let prepared_input_id = field_input_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<16> =
                    ::core::default::Default::default();
                if prepared_num_dims.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_offsets.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u32]>>(1);
                }
                if prepared_sizes.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u32]>>(2);
                }
                if prepared_input_id.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(4);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(5);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_num_dims) = prepared_num_dims {
                            object_writer.write::<_, _, 4>(&prepared_num_dims);
                        }
                        if let ::core::option::Option::Some(prepared_offsets) = prepared_offsets {
                            object_writer.write::<_, _, 4>(&prepared_offsets);
                        }
                        if let ::core::option::Option::Some(prepared_sizes) = prepared_sizes {
                            object_writer.write::<_, _, 4>(&prepared_sizes);
                        }
                        if let ::core::option::Option::Some(prepared_input_id) = prepared_input_id {
                            object_writer.write::<_, _, 4>(&prepared_input_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnStaticSlice>> for XnnStaticSlice {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnStaticSlice> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnStaticSlice>> for XnnStaticSlice {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnStaticSlice>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnStaticSlice> for XnnStaticSlice {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnStaticSlice> {
                XnnStaticSlice::create(
                    builder,
                    self.num_dims,
                    &self.offsets,
                    &self.sizes,
                    self.input_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnStaticSlice] type.
        ///
        /// Can be created using the [XnnStaticSlice::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnStaticSliceBuilder<State>(State);

        impl XnnStaticSliceBuilder<()> {
            /// Setter for the [`num_dims` field](XnnStaticSlice#structfield.num_dims).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_dims<T0>(self, value: T0) -> XnnStaticSliceBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnStaticSliceBuilder((value,))
            }

            /// Sets the [`num_dims` field](XnnStaticSlice#structfield.num_dims) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_dims_as_default(self) -> XnnStaticSliceBuilder<(::planus::DefaultValue,)> {
                self.num_dims(::planus::DefaultValue)
            }
        }

        impl<T0> XnnStaticSliceBuilder<(T0,)> {
            /// Setter for the [`offsets` field](XnnStaticSlice#structfield.offsets).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn offsets<T1>(self, value: T1) -> XnnStaticSliceBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
            {
                let (v0,) = self.0;
                XnnStaticSliceBuilder((v0, value))
            }

            /// Sets the [`offsets` field](XnnStaticSlice#structfield.offsets) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn offsets_as_null(self) -> XnnStaticSliceBuilder<(T0, ())> {
                self.offsets(())
            }
        }

        impl<T0, T1> XnnStaticSliceBuilder<(T0, T1)> {
            /// Setter for the [`sizes` field](XnnStaticSlice#structfield.sizes).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn sizes<T2>(self, value: T2) -> XnnStaticSliceBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
            {
                let (v0, v1) = self.0;
                XnnStaticSliceBuilder((v0, v1, value))
            }

            /// Sets the [`sizes` field](XnnStaticSlice#structfield.sizes) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn sizes_as_null(self) -> XnnStaticSliceBuilder<(T0, T1, ())> {
                self.sizes(())
            }
        }

        impl<T0, T1, T2> XnnStaticSliceBuilder<(T0, T1, T2)> {
            /// Setter for the [`input_id` field](XnnStaticSlice#structfield.input_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id<T3>(self, value: T3) -> XnnStaticSliceBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnStaticSliceBuilder((v0, v1, v2, value))
            }

            /// Sets the [`input_id` field](XnnStaticSlice#structfield.input_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id_as_default(
                self,
            ) -> XnnStaticSliceBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.input_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnStaticSliceBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`output_id` field](XnnStaticSlice#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T4>(self, value: T4) -> XnnStaticSliceBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnStaticSliceBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`output_id` field](XnnStaticSlice#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnStaticSliceBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnStaticSliceBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`flags` field](XnnStaticSlice#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T5>(self, value: T5) -> XnnStaticSliceBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                XnnStaticSliceBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`flags` field](XnnStaticSlice#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnStaticSliceBuilder<(T0, T1, T2, T3, T4, ::planus::DefaultValue)> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5> XnnStaticSliceBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnStaticSlice].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnStaticSlice>
            where
                Self: ::planus::WriteAsOffset<XnnStaticSlice>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnStaticSlice>>
            for XnnStaticSliceBuilder<(T0, T1, T2, T3, T4, T5)>
        {
            type Prepared = ::planus::Offset<XnnStaticSlice>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnStaticSlice> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnStaticSlice>>
            for XnnStaticSliceBuilder<(T0, T1, T2, T3, T4, T5)>
        {
            type Prepared = ::planus::Offset<XnnStaticSlice>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnStaticSlice>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnStaticSlice>
            for XnnStaticSliceBuilder<(T0, T1, T2, T3, T4, T5)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnStaticSlice> {
                let (v0, v1, v2, v3, v4, v5) = &self.0;
                XnnStaticSlice::create(builder, v0, v1, v2, v3, v4, v5)
            }
        }

        /// Reference to a deserialized [XnnStaticSlice].
        #[derive(Copy, Clone)]
        pub struct XnnStaticSliceRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnStaticSliceRef<'a> {
            /// Getter for the [`num_dims` field](XnnStaticSlice#structfield.num_dims).
            #[inline]
            pub fn num_dims(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(0, "XnnStaticSlice", "num_dims")?.unwrap_or(0),
                )
            }

            /// Getter for the [`offsets` field](XnnStaticSlice#structfield.offsets).
            #[inline]
            pub fn offsets(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u32>>> {
                self.0.access(1, "XnnStaticSlice", "offsets")
            }

            /// Getter for the [`sizes` field](XnnStaticSlice#structfield.sizes).
            #[inline]
            pub fn sizes(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u32>>> {
                self.0.access(2, "XnnStaticSlice", "sizes")
            }

            /// Getter for the [`input_id` field](XnnStaticSlice#structfield.input_id).
            #[inline]
            pub fn input_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(3, "XnnStaticSlice", "input_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnStaticSlice#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "XnnStaticSlice", "output_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnStaticSlice#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(5, "XnnStaticSlice", "flags")?.unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for XnnStaticSliceRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnStaticSliceRef");
                f.field("num_dims", &self.num_dims());
                if let ::core::option::Option::Some(field_offsets) = self.offsets().transpose() {
                    f.field("offsets", &field_offsets);
                }
                if let ::core::option::Option::Some(field_sizes) = self.sizes().transpose() {
                    f.field("sizes", &field_sizes);
                }
                f.field("input_id", &self.input_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnStaticSliceRef<'a>> for XnnStaticSlice {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnStaticSliceRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    num_dims: ::core::convert::TryInto::try_into(value.num_dims()?)?,
                    offsets: if let ::core::option::Option::Some(offsets) = value.offsets()? {
                        ::core::option::Option::Some(offsets.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    sizes: if let ::core::option::Option::Some(sizes) = value.sizes()? {
                        ::core::option::Option::Some(sizes.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    input_id: ::core::convert::TryInto::try_into(value.input_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnStaticSliceRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnStaticSliceRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnStaticSliceRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnStaticSlice>> for XnnStaticSlice {
            type Value = ::planus::Offset<XnnStaticSlice>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnStaticSlice>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnStaticSliceRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnStaticSliceRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNScaledDotProductAttention` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNScaledDotProductAttention` in the file `schema/xnnpack.fbs:310`
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
        pub struct XnnScaledDotProductAttention {
            /// The field `query_id` in the table `XNNScaledDotProductAttention`
            pub query_id: u32,
            /// The field `key_id` in the table `XNNScaledDotProductAttention`
            pub key_id: u32,
            /// The field `value_id` in the table `XNNScaledDotProductAttention`
            pub value_id: u32,
            /// The field `scale_id` in the table `XNNScaledDotProductAttention`
            pub scale_id: u32,
            /// The field `mask_id` in the table `XNNScaledDotProductAttention`
            pub mask_id: u32,
            /// The field `output_id` in the table `XNNScaledDotProductAttention`
            pub output_id: u32,
            /// The field `flags` in the table `XNNScaledDotProductAttention`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnScaledDotProductAttention {
            fn default() -> Self {
                Self {
                    query_id: 0,
                    key_id: 0,
                    value_id: 0,
                    scale_id: 0,
                    mask_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnScaledDotProductAttention {
            /// Creates a [XnnScaledDotProductAttentionBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnScaledDotProductAttentionBuilder<()> {
                XnnScaledDotProductAttentionBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_query_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_key_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_value_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_scale_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_mask_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_query_id = field_query_id.prepare(builder, &0);
                let prepared_key_id = field_key_id.prepare(builder, &0);
                let prepared_value_id = field_value_id.prepare(builder, &0);
                let prepared_scale_id = field_scale_id.prepare(builder, &0);
                let prepared_mask_id = field_mask_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<18> =
                    ::core::default::Default::default();
                if prepared_query_id.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_key_id.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_value_id.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_scale_id.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_mask_id.is_some() {
                    table_writer.write_entry::<u32>(4);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(5);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(6);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_query_id) = prepared_query_id {
                            object_writer.write::<_, _, 4>(&prepared_query_id);
                        }
                        if let ::core::option::Option::Some(prepared_key_id) = prepared_key_id {
                            object_writer.write::<_, _, 4>(&prepared_key_id);
                        }
                        if let ::core::option::Option::Some(prepared_value_id) = prepared_value_id {
                            object_writer.write::<_, _, 4>(&prepared_value_id);
                        }
                        if let ::core::option::Option::Some(prepared_scale_id) = prepared_scale_id {
                            object_writer.write::<_, _, 4>(&prepared_scale_id);
                        }
                        if let ::core::option::Option::Some(prepared_mask_id) = prepared_mask_id {
                            object_writer.write::<_, _, 4>(&prepared_mask_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnScaledDotProductAttention>>
            for XnnScaledDotProductAttention
        {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnScaledDotProductAttention> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnScaledDotProductAttention>>
            for XnnScaledDotProductAttention
        {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnScaledDotProductAttention>>
            {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnScaledDotProductAttention> for XnnScaledDotProductAttention {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnScaledDotProductAttention> {
                XnnScaledDotProductAttention::create(
                    builder,
                    self.query_id,
                    self.key_id,
                    self.value_id,
                    self.scale_id,
                    self.mask_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnScaledDotProductAttention] type.
        ///
        /// Can be created using the [XnnScaledDotProductAttention::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnScaledDotProductAttentionBuilder<State>(State);

        impl XnnScaledDotProductAttentionBuilder<()> {
            /// Setter for the [`query_id` field](XnnScaledDotProductAttention#structfield.query_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn query_id<T0>(self, value: T0) -> XnnScaledDotProductAttentionBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnScaledDotProductAttentionBuilder((value,))
            }

            /// Sets the [`query_id` field](XnnScaledDotProductAttention#structfield.query_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn query_id_as_default(
                self,
            ) -> XnnScaledDotProductAttentionBuilder<(::planus::DefaultValue,)> {
                self.query_id(::planus::DefaultValue)
            }
        }

        impl<T0> XnnScaledDotProductAttentionBuilder<(T0,)> {
            /// Setter for the [`key_id` field](XnnScaledDotProductAttention#structfield.key_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn key_id<T1>(self, value: T1) -> XnnScaledDotProductAttentionBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnScaledDotProductAttentionBuilder((v0, value))
            }

            /// Sets the [`key_id` field](XnnScaledDotProductAttention#structfield.key_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn key_id_as_default(
                self,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, ::planus::DefaultValue)> {
                self.key_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnScaledDotProductAttentionBuilder<(T0, T1)> {
            /// Setter for the [`value_id` field](XnnScaledDotProductAttention#structfield.value_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn value_id<T2>(
                self,
                value: T2,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnScaledDotProductAttentionBuilder((v0, v1, value))
            }

            /// Sets the [`value_id` field](XnnScaledDotProductAttention#structfield.value_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn value_id_as_default(
                self,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.value_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnScaledDotProductAttentionBuilder<(T0, T1, T2)> {
            /// Setter for the [`scale_id` field](XnnScaledDotProductAttention#structfield.scale_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale_id<T3>(
                self,
                value: T3,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnScaledDotProductAttentionBuilder((v0, v1, v2, value))
            }

            /// Sets the [`scale_id` field](XnnScaledDotProductAttention#structfield.scale_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn scale_id_as_default(
                self,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, ::planus::DefaultValue)>
            {
                self.scale_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`mask_id` field](XnnScaledDotProductAttention#structfield.mask_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn mask_id<T4>(
                self,
                value: T4,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnScaledDotProductAttentionBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`mask_id` field](XnnScaledDotProductAttention#structfield.mask_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn mask_id_as_default(
                self,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)>
            {
                self.mask_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`output_id` field](XnnScaledDotProductAttention#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T5>(
                self,
                value: T5,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                XnnScaledDotProductAttentionBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`output_id` field](XnnScaledDotProductAttention#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4, ::planus::DefaultValue)>
            {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Setter for the [`flags` field](XnnScaledDotProductAttention#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T6>(
                self,
                value: T6,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4, T5, T6)>
            where
                T6: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5) = self.0;
                XnnScaledDotProductAttentionBuilder((v0, v1, v2, v3, v4, v5, value))
            }

            /// Sets the [`flags` field](XnnScaledDotProductAttention#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4, T5, ::planus::DefaultValue)>
            {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6> XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4, T5, T6)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnScaledDotProductAttention].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnScaledDotProductAttention>
            where
                Self: ::planus::WriteAsOffset<XnnScaledDotProductAttention>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnScaledDotProductAttention>>
            for XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4, T5, T6)>
        {
            type Prepared = ::planus::Offset<XnnScaledDotProductAttention>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnScaledDotProductAttention> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnScaledDotProductAttention>>
            for XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4, T5, T6)>
        {
            type Prepared = ::planus::Offset<XnnScaledDotProductAttention>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnScaledDotProductAttention>>
            {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnScaledDotProductAttention>
            for XnnScaledDotProductAttentionBuilder<(T0, T1, T2, T3, T4, T5, T6)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnScaledDotProductAttention> {
                let (v0, v1, v2, v3, v4, v5, v6) = &self.0;
                XnnScaledDotProductAttention::create(builder, v0, v1, v2, v3, v4, v5, v6)
            }
        }

        /// Reference to a deserialized [XnnScaledDotProductAttention].
        #[derive(Copy, Clone)]
        pub struct XnnScaledDotProductAttentionRef<'a>(
            #[allow(dead_code)] ::planus::table_reader::Table<'a>,
        );

        impl<'a> XnnScaledDotProductAttentionRef<'a> {
            /// Getter for the [`query_id` field](XnnScaledDotProductAttention#structfield.query_id).
            #[inline]
            pub fn query_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "XnnScaledDotProductAttention", "query_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`key_id` field](XnnScaledDotProductAttention#structfield.key_id).
            #[inline]
            pub fn key_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "XnnScaledDotProductAttention", "key_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`value_id` field](XnnScaledDotProductAttention#structfield.value_id).
            #[inline]
            pub fn value_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "XnnScaledDotProductAttention", "value_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`scale_id` field](XnnScaledDotProductAttention#structfield.scale_id).
            #[inline]
            pub fn scale_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "XnnScaledDotProductAttention", "scale_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`mask_id` field](XnnScaledDotProductAttention#structfield.mask_id).
            #[inline]
            pub fn mask_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "XnnScaledDotProductAttention", "mask_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnScaledDotProductAttention#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(5, "XnnScaledDotProductAttention", "output_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnScaledDotProductAttention#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(6, "XnnScaledDotProductAttention", "flags")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for XnnScaledDotProductAttentionRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnScaledDotProductAttentionRef");
                f.field("query_id", &self.query_id());
                f.field("key_id", &self.key_id());
                f.field("value_id", &self.value_id());
                f.field("scale_id", &self.scale_id());
                f.field("mask_id", &self.mask_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnScaledDotProductAttentionRef<'a>>
            for XnnScaledDotProductAttention
        {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnScaledDotProductAttentionRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    query_id: ::core::convert::TryInto::try_into(value.query_id()?)?,
                    key_id: ::core::convert::TryInto::try_into(value.key_id()?)?,
                    value_id: ::core::convert::TryInto::try_into(value.value_id()?)?,
                    scale_id: ::core::convert::TryInto::try_into(value.scale_id()?)?,
                    mask_id: ::core::convert::TryInto::try_into(value.mask_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnScaledDotProductAttentionRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnScaledDotProductAttentionRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnScaledDotProductAttentionRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnScaledDotProductAttention>>
            for XnnScaledDotProductAttention
        {
            type Value = ::planus::Offset<XnnScaledDotProductAttention>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnScaledDotProductAttention>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnScaledDotProductAttentionRef<'a> {
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
                        "[XnnScaledDotProductAttentionRef]",
                        "read_as_root",
                        0,
                    )
                })
            }
        }

        /// The table `XNNArgMaxPooling2d` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNArgMaxPooling2d` in the file `schema/xnnpack.fbs:320`
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
        pub struct XnnArgMaxPooling2d {
            /// The field `padding_top` in the table `XNNArgMaxPooling2d`
            pub padding_top: u32,
            /// The field `padding_right` in the table `XNNArgMaxPooling2d`
            pub padding_right: u32,
            /// The field `padding_bottom` in the table `XNNArgMaxPooling2d`
            pub padding_bottom: u32,
            /// The field `padding_left` in the table `XNNArgMaxPooling2d`
            pub padding_left: u32,
            /// The field `pooling_height` in the table `XNNArgMaxPooling2d`
            pub pooling_height: u32,
            /// The field `pooling_width` in the table `XNNArgMaxPooling2d`
            pub pooling_width: u32,
            /// The field `input_id` in the table `XNNArgMaxPooling2d`
            pub input_id: u32,
            /// The field `output_value_id` in the table `XNNArgMaxPooling2d`
            pub output_value_id: u32,
            /// The field `output_index_id` in the table `XNNArgMaxPooling2d`
            pub output_index_id: u32,
            /// The field `flags` in the table `XNNArgMaxPooling2d`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnArgMaxPooling2d {
            fn default() -> Self {
                Self {
                    padding_top: 0,
                    padding_right: 0,
                    padding_bottom: 0,
                    padding_left: 0,
                    pooling_height: 0,
                    pooling_width: 0,
                    input_id: 0,
                    output_value_id: 0,
                    output_index_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnArgMaxPooling2d {
            /// Creates a [XnnArgMaxPooling2dBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnArgMaxPooling2dBuilder<()> {
                XnnArgMaxPooling2dBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_padding_top: impl ::planus::WriteAsDefault<u32, u32>,
                field_padding_right: impl ::planus::WriteAsDefault<u32, u32>,
                field_padding_bottom: impl ::planus::WriteAsDefault<u32, u32>,
                field_padding_left: impl ::planus::WriteAsDefault<u32, u32>,
                field_pooling_height: impl ::planus::WriteAsDefault<u32, u32>,
                field_pooling_width: impl ::planus::WriteAsDefault<u32, u32>,
                field_input_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_value_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_index_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_padding_top = field_padding_top.prepare(builder, &0);
                let prepared_padding_right = field_padding_right.prepare(builder, &0);
                let prepared_padding_bottom = field_padding_bottom.prepare(builder, &0);
                let prepared_padding_left = field_padding_left.prepare(builder, &0);
                let prepared_pooling_height = field_pooling_height.prepare(builder, &0);
                let prepared_pooling_width = field_pooling_width.prepare(builder, &0);
                let prepared_input_id = field_input_id.prepare(builder, &0);
                let prepared_output_value_id = field_output_value_id.prepare(builder, &0);
                let prepared_output_index_id = field_output_index_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<24> =
                    ::core::default::Default::default();
                if prepared_padding_top.is_some() {
                    table_writer.write_entry::<u32>(0);
                }
                if prepared_padding_right.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_padding_bottom.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_padding_left.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_pooling_height.is_some() {
                    table_writer.write_entry::<u32>(4);
                }
                if prepared_pooling_width.is_some() {
                    table_writer.write_entry::<u32>(5);
                }
                if prepared_input_id.is_some() {
                    table_writer.write_entry::<u32>(6);
                }
                if prepared_output_value_id.is_some() {
                    table_writer.write_entry::<u32>(7);
                }
                if prepared_output_index_id.is_some() {
                    table_writer.write_entry::<u32>(8);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(9);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_padding_top) =
                            prepared_padding_top
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_top);
                        }
                        if let ::core::option::Option::Some(prepared_padding_right) =
                            prepared_padding_right
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_right);
                        }
                        if let ::core::option::Option::Some(prepared_padding_bottom) =
                            prepared_padding_bottom
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_bottom);
                        }
                        if let ::core::option::Option::Some(prepared_padding_left) =
                            prepared_padding_left
                        {
                            object_writer.write::<_, _, 4>(&prepared_padding_left);
                        }
                        if let ::core::option::Option::Some(prepared_pooling_height) =
                            prepared_pooling_height
                        {
                            object_writer.write::<_, _, 4>(&prepared_pooling_height);
                        }
                        if let ::core::option::Option::Some(prepared_pooling_width) =
                            prepared_pooling_width
                        {
                            object_writer.write::<_, _, 4>(&prepared_pooling_width);
                        }
                        if let ::core::option::Option::Some(prepared_input_id) = prepared_input_id {
                            object_writer.write::<_, _, 4>(&prepared_input_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_value_id) =
                            prepared_output_value_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_value_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_index_id) =
                            prepared_output_index_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_index_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnArgMaxPooling2d>> for XnnArgMaxPooling2d {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnArgMaxPooling2d> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnArgMaxPooling2d>> for XnnArgMaxPooling2d {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnArgMaxPooling2d>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnArgMaxPooling2d> for XnnArgMaxPooling2d {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnArgMaxPooling2d> {
                XnnArgMaxPooling2d::create(
                    builder,
                    self.padding_top,
                    self.padding_right,
                    self.padding_bottom,
                    self.padding_left,
                    self.pooling_height,
                    self.pooling_width,
                    self.input_id,
                    self.output_value_id,
                    self.output_index_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnArgMaxPooling2d] type.
        ///
        /// Can be created using the [XnnArgMaxPooling2d::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnArgMaxPooling2dBuilder<State>(State);

        impl XnnArgMaxPooling2dBuilder<()> {
            /// Setter for the [`padding_top` field](XnnArgMaxPooling2d#structfield.padding_top).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_top<T0>(self, value: T0) -> XnnArgMaxPooling2dBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u32, u32>,
            {
                XnnArgMaxPooling2dBuilder((value,))
            }

            /// Sets the [`padding_top` field](XnnArgMaxPooling2d#structfield.padding_top) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_top_as_default(
                self,
            ) -> XnnArgMaxPooling2dBuilder<(::planus::DefaultValue,)> {
                self.padding_top(::planus::DefaultValue)
            }
        }

        impl<T0> XnnArgMaxPooling2dBuilder<(T0,)> {
            /// Setter for the [`padding_right` field](XnnArgMaxPooling2d#structfield.padding_right).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_right<T1>(self, value: T1) -> XnnArgMaxPooling2dBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnArgMaxPooling2dBuilder((v0, value))
            }

            /// Sets the [`padding_right` field](XnnArgMaxPooling2d#structfield.padding_right) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_right_as_default(
                self,
            ) -> XnnArgMaxPooling2dBuilder<(T0, ::planus::DefaultValue)> {
                self.padding_right(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnArgMaxPooling2dBuilder<(T0, T1)> {
            /// Setter for the [`padding_bottom` field](XnnArgMaxPooling2d#structfield.padding_bottom).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_bottom<T2>(self, value: T2) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnArgMaxPooling2dBuilder((v0, v1, value))
            }

            /// Sets the [`padding_bottom` field](XnnArgMaxPooling2d#structfield.padding_bottom) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_bottom_as_default(
                self,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.padding_bottom(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnArgMaxPooling2dBuilder<(T0, T1, T2)> {
            /// Setter for the [`padding_left` field](XnnArgMaxPooling2d#structfield.padding_left).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_left<T3>(self, value: T3) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnArgMaxPooling2dBuilder((v0, v1, v2, value))
            }

            /// Sets the [`padding_left` field](XnnArgMaxPooling2d#structfield.padding_left) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn padding_left_as_default(
                self,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.padding_left(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`pooling_height` field](XnnArgMaxPooling2d#structfield.pooling_height).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn pooling_height<T4>(
                self,
                value: T4,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnArgMaxPooling2dBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`pooling_height` field](XnnArgMaxPooling2d#structfield.pooling_height) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn pooling_height_as_default(
                self,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, ::planus::DefaultValue)> {
                self.pooling_height(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`pooling_width` field](XnnArgMaxPooling2d#structfield.pooling_width).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn pooling_width<T5>(
                self,
                value: T5,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                XnnArgMaxPooling2dBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`pooling_width` field](XnnArgMaxPooling2d#structfield.pooling_width) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn pooling_width_as_default(
                self,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, ::planus::DefaultValue)>
            {
                self.pooling_width(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Setter for the [`input_id` field](XnnArgMaxPooling2d#structfield.input_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id<T6>(
                self,
                value: T6,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6)>
            where
                T6: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5) = self.0;
                XnnArgMaxPooling2dBuilder((v0, v1, v2, v3, v4, v5, value))
            }

            /// Sets the [`input_id` field](XnnArgMaxPooling2d#structfield.input_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id_as_default(
                self,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, ::planus::DefaultValue)>
            {
                self.input_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6)> {
            /// Setter for the [`output_value_id` field](XnnArgMaxPooling2d#structfield.output_value_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_value_id<T7>(
                self,
                value: T7,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
            where
                T7: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6) = self.0;
                XnnArgMaxPooling2dBuilder((v0, v1, v2, v3, v4, v5, v6, value))
            }

            /// Sets the [`output_value_id` field](XnnArgMaxPooling2d#structfield.output_value_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_value_id_as_default(
                self,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, ::planus::DefaultValue)>
            {
                self.output_value_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)> {
            /// Setter for the [`output_index_id` field](XnnArgMaxPooling2d#structfield.output_index_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_index_id<T8>(
                self,
                value: T8,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
            where
                T8: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7) = self.0;
                XnnArgMaxPooling2dBuilder((v0, v1, v2, v3, v4, v5, v6, v7, value))
            }

            /// Sets the [`output_index_id` field](XnnArgMaxPooling2d#structfield.output_index_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_index_id_as_default(
                self,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, ::planus::DefaultValue)>
            {
                self.output_index_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8>
            XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
        {
            /// Setter for the [`flags` field](XnnArgMaxPooling2d#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T9>(
                self,
                value: T9,
            ) -> XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
            where
                T9: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8) = self.0;
                XnnArgMaxPooling2dBuilder((v0, v1, v2, v3, v4, v5, v6, v7, v8, value))
            }

            /// Sets the [`flags` field](XnnArgMaxPooling2d#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnArgMaxPooling2dBuilder<(
                T0,
                T1,
                T2,
                T3,
                T4,
                T5,
                T6,
                T7,
                T8,
                ::planus::DefaultValue,
            )> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8, T9>
            XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnArgMaxPooling2d].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnArgMaxPooling2d>
            where
                Self: ::planus::WriteAsOffset<XnnArgMaxPooling2d>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
                T8: ::planus::WriteAsDefault<u32, u32>,
                T9: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnArgMaxPooling2d>>
            for XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            type Prepared = ::planus::Offset<XnnArgMaxPooling2d>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnArgMaxPooling2d> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
                T8: ::planus::WriteAsDefault<u32, u32>,
                T9: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnArgMaxPooling2d>>
            for XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            type Prepared = ::planus::Offset<XnnArgMaxPooling2d>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnArgMaxPooling2d>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u32, u32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsDefault<u32, u32>,
                T5: ::planus::WriteAsDefault<u32, u32>,
                T6: ::planus::WriteAsDefault<u32, u32>,
                T7: ::planus::WriteAsDefault<u32, u32>,
                T8: ::planus::WriteAsDefault<u32, u32>,
                T9: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnArgMaxPooling2d>
            for XnnArgMaxPooling2dBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8, T9)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<XnnArgMaxPooling2d> {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9) = &self.0;
                XnnArgMaxPooling2d::create(builder, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9)
            }
        }

        /// Reference to a deserialized [XnnArgMaxPooling2d].
        #[derive(Copy, Clone)]
        pub struct XnnArgMaxPooling2dRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnArgMaxPooling2dRef<'a> {
            /// Getter for the [`padding_top` field](XnnArgMaxPooling2d#structfield.padding_top).
            #[inline]
            pub fn padding_top(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "XnnArgMaxPooling2d", "padding_top")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`padding_right` field](XnnArgMaxPooling2d#structfield.padding_right).
            #[inline]
            pub fn padding_right(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(1, "XnnArgMaxPooling2d", "padding_right")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`padding_bottom` field](XnnArgMaxPooling2d#structfield.padding_bottom).
            #[inline]
            pub fn padding_bottom(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(2, "XnnArgMaxPooling2d", "padding_bottom")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`padding_left` field](XnnArgMaxPooling2d#structfield.padding_left).
            #[inline]
            pub fn padding_left(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(3, "XnnArgMaxPooling2d", "padding_left")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`pooling_height` field](XnnArgMaxPooling2d#structfield.pooling_height).
            #[inline]
            pub fn pooling_height(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(4, "XnnArgMaxPooling2d", "pooling_height")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`pooling_width` field](XnnArgMaxPooling2d#structfield.pooling_width).
            #[inline]
            pub fn pooling_width(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(5, "XnnArgMaxPooling2d", "pooling_width")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`input_id` field](XnnArgMaxPooling2d#structfield.input_id).
            #[inline]
            pub fn input_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(6, "XnnArgMaxPooling2d", "input_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`output_value_id` field](XnnArgMaxPooling2d#structfield.output_value_id).
            #[inline]
            pub fn output_value_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(7, "XnnArgMaxPooling2d", "output_value_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`output_index_id` field](XnnArgMaxPooling2d#structfield.output_index_id).
            #[inline]
            pub fn output_index_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(8, "XnnArgMaxPooling2d", "output_index_id")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnArgMaxPooling2d#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(9, "XnnArgMaxPooling2d", "flags")?
                        .unwrap_or(0),
                )
            }
        }

        impl<'a> ::core::fmt::Debug for XnnArgMaxPooling2dRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnArgMaxPooling2dRef");
                f.field("padding_top", &self.padding_top());
                f.field("padding_right", &self.padding_right());
                f.field("padding_bottom", &self.padding_bottom());
                f.field("padding_left", &self.padding_left());
                f.field("pooling_height", &self.pooling_height());
                f.field("pooling_width", &self.pooling_width());
                f.field("input_id", &self.input_id());
                f.field("output_value_id", &self.output_value_id());
                f.field("output_index_id", &self.output_index_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnArgMaxPooling2dRef<'a>> for XnnArgMaxPooling2d {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnArgMaxPooling2dRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    padding_top: ::core::convert::TryInto::try_into(value.padding_top()?)?,
                    padding_right: ::core::convert::TryInto::try_into(value.padding_right()?)?,
                    padding_bottom: ::core::convert::TryInto::try_into(value.padding_bottom()?)?,
                    padding_left: ::core::convert::TryInto::try_into(value.padding_left()?)?,
                    pooling_height: ::core::convert::TryInto::try_into(value.pooling_height()?)?,
                    pooling_width: ::core::convert::TryInto::try_into(value.pooling_width()?)?,
                    input_id: ::core::convert::TryInto::try_into(value.input_id()?)?,
                    output_value_id: ::core::convert::TryInto::try_into(value.output_value_id()?)?,
                    output_index_id: ::core::convert::TryInto::try_into(value.output_index_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnArgMaxPooling2dRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnArgMaxPooling2dRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnArgMaxPooling2dRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnArgMaxPooling2d>> for XnnArgMaxPooling2d {
            type Value = ::planus::Offset<XnnArgMaxPooling2d>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnArgMaxPooling2d>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnArgMaxPooling2dRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnArgMaxPooling2dRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNLeakyReLU` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNLeakyReLU` in the file `schema/xnnpack.fbs:333`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct XnnLeakyReLu {
            /// The field `negative_slope` in the table `XNNLeakyReLU`
            pub negative_slope: f32,
            /// The field `input_id` in the table `XNNLeakyReLU`
            pub input_id: u32,
            /// The field `output_id` in the table `XNNLeakyReLU`
            pub output_id: u32,
            /// The field `flags` in the table `XNNLeakyReLU`
            pub flags: u32,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnLeakyReLu {
            fn default() -> Self {
                Self {
                    negative_slope: 0.0,
                    input_id: 0,
                    output_id: 0,
                    flags: 0,
                }
            }
        }

        impl XnnLeakyReLu {
            /// Creates a [XnnLeakyReLuBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnLeakyReLuBuilder<()> {
                XnnLeakyReLuBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_negative_slope: impl ::planus::WriteAsDefault<f32, f32>,
                field_input_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_output_id: impl ::planus::WriteAsDefault<u32, u32>,
                field_flags: impl ::planus::WriteAsDefault<u32, u32>,
            ) -> ::planus::Offset<Self> {
                let prepared_negative_slope = field_negative_slope.prepare(builder, &0.0);
                let prepared_input_id = field_input_id.prepare(builder, &0);
                let prepared_output_id = field_output_id.prepare(builder, &0);
                let prepared_flags = field_flags.prepare(builder, &0);

                let mut table_writer: ::planus::table_writer::TableWriter<12> =
                    ::core::default::Default::default();
                if prepared_negative_slope.is_some() {
                    table_writer.write_entry::<f32>(0);
                }
                if prepared_input_id.is_some() {
                    table_writer.write_entry::<u32>(1);
                }
                if prepared_output_id.is_some() {
                    table_writer.write_entry::<u32>(2);
                }
                if prepared_flags.is_some() {
                    table_writer.write_entry::<u32>(3);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_negative_slope) =
                            prepared_negative_slope
                        {
                            object_writer.write::<_, _, 4>(&prepared_negative_slope);
                        }
                        if let ::core::option::Option::Some(prepared_input_id) = prepared_input_id {
                            object_writer.write::<_, _, 4>(&prepared_input_id);
                        }
                        if let ::core::option::Option::Some(prepared_output_id) = prepared_output_id
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_id);
                        }
                        if let ::core::option::Option::Some(prepared_flags) = prepared_flags {
                            object_writer.write::<_, _, 4>(&prepared_flags);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnLeakyReLu>> for XnnLeakyReLu {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnLeakyReLu> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnLeakyReLu>> for XnnLeakyReLu {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnLeakyReLu>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnLeakyReLu> for XnnLeakyReLu {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnLeakyReLu> {
                XnnLeakyReLu::create(
                    builder,
                    self.negative_slope,
                    self.input_id,
                    self.output_id,
                    self.flags,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnLeakyReLu] type.
        ///
        /// Can be created using the [XnnLeakyReLu::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnLeakyReLuBuilder<State>(State);

        impl XnnLeakyReLuBuilder<()> {
            /// Setter for the [`negative_slope` field](XnnLeakyReLu#structfield.negative_slope).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn negative_slope<T0>(self, value: T0) -> XnnLeakyReLuBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<f32, f32>,
            {
                XnnLeakyReLuBuilder((value,))
            }

            /// Sets the [`negative_slope` field](XnnLeakyReLu#structfield.negative_slope) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn negative_slope_as_default(
                self,
            ) -> XnnLeakyReLuBuilder<(::planus::DefaultValue,)> {
                self.negative_slope(::planus::DefaultValue)
            }
        }

        impl<T0> XnnLeakyReLuBuilder<(T0,)> {
            /// Setter for the [`input_id` field](XnnLeakyReLu#structfield.input_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id<T1>(self, value: T1) -> XnnLeakyReLuBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0,) = self.0;
                XnnLeakyReLuBuilder((v0, value))
            }

            /// Sets the [`input_id` field](XnnLeakyReLu#structfield.input_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_id_as_default(self) -> XnnLeakyReLuBuilder<(T0, ::planus::DefaultValue)> {
                self.input_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1> XnnLeakyReLuBuilder<(T0, T1)> {
            /// Setter for the [`output_id` field](XnnLeakyReLu#structfield.output_id).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id<T2>(self, value: T2) -> XnnLeakyReLuBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1) = self.0;
                XnnLeakyReLuBuilder((v0, v1, value))
            }

            /// Sets the [`output_id` field](XnnLeakyReLu#structfield.output_id) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_id_as_default(
                self,
            ) -> XnnLeakyReLuBuilder<(T0, T1, ::planus::DefaultValue)> {
                self.output_id(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2> XnnLeakyReLuBuilder<(T0, T1, T2)> {
            /// Setter for the [`flags` field](XnnLeakyReLu#structfield.flags).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags<T3>(self, value: T3) -> XnnLeakyReLuBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnLeakyReLuBuilder((v0, v1, v2, value))
            }

            /// Sets the [`flags` field](XnnLeakyReLu#structfield.flags) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn flags_as_default(
                self,
            ) -> XnnLeakyReLuBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.flags(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnLeakyReLuBuilder<(T0, T1, T2, T3)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnLeakyReLu].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnLeakyReLu>
            where
                Self: ::planus::WriteAsOffset<XnnLeakyReLu>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<f32, f32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAs<::planus::Offset<XnnLeakyReLu>>
            for XnnLeakyReLuBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<XnnLeakyReLu>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnLeakyReLu> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<f32, f32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOptional<::planus::Offset<XnnLeakyReLu>>
            for XnnLeakyReLuBuilder<(T0, T1, T2, T3)>
        {
            type Prepared = ::planus::Offset<XnnLeakyReLu>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnLeakyReLu>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<f32, f32>,
                T1: ::planus::WriteAsDefault<u32, u32>,
                T2: ::planus::WriteAsDefault<u32, u32>,
                T3: ::planus::WriteAsDefault<u32, u32>,
            > ::planus::WriteAsOffset<XnnLeakyReLu> for XnnLeakyReLuBuilder<(T0, T1, T2, T3)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnLeakyReLu> {
                let (v0, v1, v2, v3) = &self.0;
                XnnLeakyReLu::create(builder, v0, v1, v2, v3)
            }
        }

        /// Reference to a deserialized [XnnLeakyReLu].
        #[derive(Copy, Clone)]
        pub struct XnnLeakyReLuRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnLeakyReLuRef<'a> {
            /// Getter for the [`negative_slope` field](XnnLeakyReLu#structfield.negative_slope).
            #[inline]
            pub fn negative_slope(&self) -> ::planus::Result<f32> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "XnnLeakyReLu", "negative_slope")?
                        .unwrap_or(0.0),
                )
            }

            /// Getter for the [`input_id` field](XnnLeakyReLu#structfield.input_id).
            #[inline]
            pub fn input_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(1, "XnnLeakyReLu", "input_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`output_id` field](XnnLeakyReLu#structfield.output_id).
            #[inline]
            pub fn output_id(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(2, "XnnLeakyReLu", "output_id")?.unwrap_or(0),
                )
            }

            /// Getter for the [`flags` field](XnnLeakyReLu#structfield.flags).
            #[inline]
            pub fn flags(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(self.0.access(3, "XnnLeakyReLu", "flags")?.unwrap_or(0))
            }
        }

        impl<'a> ::core::fmt::Debug for XnnLeakyReLuRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnLeakyReLuRef");
                f.field("negative_slope", &self.negative_slope());
                f.field("input_id", &self.input_id());
                f.field("output_id", &self.output_id());
                f.field("flags", &self.flags());
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnLeakyReLuRef<'a>> for XnnLeakyReLu {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnLeakyReLuRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    negative_slope: ::core::convert::TryInto::try_into(value.negative_slope()?)?,
                    input_id: ::core::convert::TryInto::try_into(value.input_id()?)?,
                    output_id: ::core::convert::TryInto::try_into(value.output_id()?)?,
                    flags: ::core::convert::TryInto::try_into(value.flags()?)?,
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnLeakyReLuRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnLeakyReLuRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[XnnLeakyReLuRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnLeakyReLu>> for XnnLeakyReLu {
            type Value = ::planus::Offset<XnnLeakyReLu>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnLeakyReLu>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnLeakyReLuRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnLeakyReLuRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `ConstantDataOffset` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `ConstantDataOffset` in the file `schema/xnnpack.fbs:343`
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
        pub struct ConstantDataOffset {
            /// The field `offset` in the table `ConstantDataOffset`
            pub offset: u64,
            /// The field `size` in the table `ConstantDataOffset`
            pub size: u64,
            /// The field `named_key` in the table `ConstantDataOffset`
            pub named_key: ::core::option::Option<::planus::alloc::string::String>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for ConstantDataOffset {
            fn default() -> Self {
                Self {
                    offset: 0,
                    size: 0,
                    named_key: ::core::default::Default::default(),
                }
            }
        }

        impl ConstantDataOffset {
            /// Creates a [ConstantDataOffsetBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> ConstantDataOffsetBuilder<()> {
                ConstantDataOffsetBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_offset: impl ::planus::WriteAsDefault<u64, u64>,
                field_size: impl ::planus::WriteAsDefault<u64, u64>,
                field_named_key: impl ::planus::WriteAsOptional<
                    ::planus::Offset<::core::primitive::str>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_offset = field_offset.prepare(builder, &0);
                let prepared_size = field_size.prepare(builder, &0);
                let prepared_named_key = field_named_key.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<10> =
                    ::core::default::Default::default();
                if prepared_offset.is_some() {
                    table_writer.write_entry::<u64>(0);
                }
                if prepared_size.is_some() {
                    table_writer.write_entry::<u64>(1);
                }
                if prepared_named_key.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(2);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_offset) = prepared_offset {
                            object_writer.write::<_, _, 8>(&prepared_offset);
                        }
                        if let ::core::option::Option::Some(prepared_size) = prepared_size {
                            object_writer.write::<_, _, 8>(&prepared_size);
                        }
                        if let ::core::option::Option::Some(prepared_named_key) = prepared_named_key
                        {
                            object_writer.write::<_, _, 4>(&prepared_named_key);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<ConstantDataOffset>> for ConstantDataOffset {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ConstantDataOffset> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<ConstantDataOffset>> for ConstantDataOffset {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<ConstantDataOffset>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<ConstantDataOffset> for ConstantDataOffset {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ConstantDataOffset> {
                ConstantDataOffset::create(builder, self.offset, self.size, &self.named_key)
            }
        }

        /// Builder for serializing an instance of the [ConstantDataOffset] type.
        ///
        /// Can be created using the [ConstantDataOffset::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct ConstantDataOffsetBuilder<State>(State);

        impl ConstantDataOffsetBuilder<()> {
            /// Setter for the [`offset` field](ConstantDataOffset#structfield.offset).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn offset<T0>(self, value: T0) -> ConstantDataOffsetBuilder<(T0,)>
            where
                T0: ::planus::WriteAsDefault<u64, u64>,
            {
                ConstantDataOffsetBuilder((value,))
            }

            /// Sets the [`offset` field](ConstantDataOffset#structfield.offset) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn offset_as_default(self) -> ConstantDataOffsetBuilder<(::planus::DefaultValue,)> {
                self.offset(::planus::DefaultValue)
            }
        }

        impl<T0> ConstantDataOffsetBuilder<(T0,)> {
            /// Setter for the [`size` field](ConstantDataOffset#structfield.size).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn size<T1>(self, value: T1) -> ConstantDataOffsetBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsDefault<u64, u64>,
            {
                let (v0,) = self.0;
                ConstantDataOffsetBuilder((v0, value))
            }

            /// Sets the [`size` field](ConstantDataOffset#structfield.size) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn size_as_default(
                self,
            ) -> ConstantDataOffsetBuilder<(T0, ::planus::DefaultValue)> {
                self.size(::planus::DefaultValue)
            }
        }

        impl<T0, T1> ConstantDataOffsetBuilder<(T0, T1)> {
            /// Setter for the [`named_key` field](ConstantDataOffset#structfield.named_key).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn named_key<T2>(self, value: T2) -> ConstantDataOffsetBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                let (v0, v1) = self.0;
                ConstantDataOffsetBuilder((v0, v1, value))
            }

            /// Sets the [`named_key` field](ConstantDataOffset#structfield.named_key) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn named_key_as_null(self) -> ConstantDataOffsetBuilder<(T0, T1, ())> {
                self.named_key(())
            }
        }

        impl<T0, T1, T2> ConstantDataOffsetBuilder<(T0, T1, T2)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [ConstantDataOffset].
            #[inline]
            pub fn finish(
                self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ConstantDataOffset>
            where
                Self: ::planus::WriteAsOffset<ConstantDataOffset>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u64, u64>,
                T1: ::planus::WriteAsDefault<u64, u64>,
                T2: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAs<::planus::Offset<ConstantDataOffset>>
            for ConstantDataOffsetBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<ConstantDataOffset>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ConstantDataOffset> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u64, u64>,
                T1: ::planus::WriteAsDefault<u64, u64>,
                T2: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAsOptional<::planus::Offset<ConstantDataOffset>>
            for ConstantDataOffsetBuilder<(T0, T1, T2)>
        {
            type Prepared = ::planus::Offset<ConstantDataOffset>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<ConstantDataOffset>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsDefault<u64, u64>,
                T1: ::planus::WriteAsDefault<u64, u64>,
                T2: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            > ::planus::WriteAsOffset<ConstantDataOffset>
            for ConstantDataOffsetBuilder<(T0, T1, T2)>
        {
            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::planus::Offset<ConstantDataOffset> {
                let (v0, v1, v2) = &self.0;
                ConstantDataOffset::create(builder, v0, v1, v2)
            }
        }

        /// Reference to a deserialized [ConstantDataOffset].
        #[derive(Copy, Clone)]
        pub struct ConstantDataOffsetRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> ConstantDataOffsetRef<'a> {
            /// Getter for the [`offset` field](ConstantDataOffset#structfield.offset).
            #[inline]
            pub fn offset(&self) -> ::planus::Result<u64> {
                ::core::result::Result::Ok(
                    self.0
                        .access(0, "ConstantDataOffset", "offset")?
                        .unwrap_or(0),
                )
            }

            /// Getter for the [`size` field](ConstantDataOffset#structfield.size).
            #[inline]
            pub fn size(&self) -> ::planus::Result<u64> {
                ::core::result::Result::Ok(
                    self.0.access(1, "ConstantDataOffset", "size")?.unwrap_or(0),
                )
            }

            /// Getter for the [`named_key` field](ConstantDataOffset#structfield.named_key).
            #[inline]
            pub fn named_key(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(2, "ConstantDataOffset", "named_key")
            }
        }

        impl<'a> ::core::fmt::Debug for ConstantDataOffsetRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("ConstantDataOffsetRef");
                f.field("offset", &self.offset());
                f.field("size", &self.size());
                if let ::core::option::Option::Some(field_named_key) = self.named_key().transpose()
                {
                    f.field("named_key", &field_named_key);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<ConstantDataOffsetRef<'a>> for ConstantDataOffset {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: ConstantDataOffsetRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    offset: ::core::convert::TryInto::try_into(value.offset()?)?,
                    size: ::core::convert::TryInto::try_into(value.size()?)?,
                    named_key: value.named_key()?.map(::core::convert::Into::into),
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for ConstantDataOffsetRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for ConstantDataOffsetRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location(
                        "[ConstantDataOffsetRef]",
                        "get",
                        buffer.offset_from_start,
                    )
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<ConstantDataOffset>> for ConstantDataOffset {
            type Value = ::planus::Offset<ConstantDataOffset>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<ConstantDataOffset>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for ConstantDataOffsetRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[ConstantDataOffsetRef]", "read_as_root", 0)
                })
            }
        }

        /// The table `XNNGraph` in the namespace `fb_xnnpack`
        ///
        /// Generated from these locations:
        /// * Table `XNNGraph` in the file `schema/xnnpack.fbs:349`
        #[derive(Clone, Debug, PartialEq, PartialOrd, ::serde::Serialize, ::serde::Deserialize)]
        pub struct XnnGraph {
            /// The field `version` in the table `XNNGraph`
            pub version: ::core::option::Option<::planus::alloc::string::String>,
            /// The field `xnodes` in the table `XNNGraph`
            pub xnodes: ::core::option::Option<::planus::alloc::vec::Vec<self::XNode>>,
            /// The field `xvalues` in the table `XNNGraph`
            pub xvalues: ::core::option::Option<::planus::alloc::vec::Vec<self::XValue>>,
            /// The field `num_externs` in the table `XNNGraph`
            pub num_externs: u32,
            /// The field `input_ids` in the table `XNNGraph`
            pub input_ids: ::core::option::Option<::planus::alloc::vec::Vec<u32>>,
            /// The field `output_ids` in the table `XNNGraph`
            pub output_ids: ::core::option::Option<::planus::alloc::vec::Vec<u32>>,
            /// The field `constant_buffer` in the table `XNNGraph`
            pub constant_buffer: ::core::option::Option<::planus::alloc::vec::Vec<self::Buffer>>,
            /// The field `mem_buffer_sizes` in the table `XNNGraph`
            pub mem_buffer_sizes: ::core::option::Option<::planus::alloc::vec::Vec<u32>>,
            /// The field `constant_data` in the table `XNNGraph`
            pub constant_data:
                ::core::option::Option<::planus::alloc::vec::Vec<self::ConstantDataOffset>>,
        }

        #[allow(clippy::derivable_impls)]
        impl ::core::default::Default for XnnGraph {
            fn default() -> Self {
                Self {
                    version: ::core::default::Default::default(),
                    xnodes: ::core::default::Default::default(),
                    xvalues: ::core::default::Default::default(),
                    num_externs: 0,
                    input_ids: ::core::default::Default::default(),
                    output_ids: ::core::default::Default::default(),
                    constant_buffer: ::core::default::Default::default(),
                    mem_buffer_sizes: ::core::default::Default::default(),
                    constant_data: ::core::default::Default::default(),
                }
            }
        }

        impl XnnGraph {
            /// Creates a [XnnGraphBuilder] for serializing an instance of this table.
            #[inline]
            pub fn builder() -> XnnGraphBuilder<()> {
                XnnGraphBuilder(())
            }

            #[allow(clippy::too_many_arguments)]
            pub fn create(
                builder: &mut ::planus::Builder,
                field_version: impl ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                field_xnodes: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::XNode>]>,
                >,
                field_xvalues: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::XValue>]>,
                >,
                field_num_externs: impl ::planus::WriteAsDefault<u32, u32>,
                field_input_ids: impl ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                field_output_ids: impl ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                field_constant_buffer: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::Buffer>]>,
                >,
                field_mem_buffer_sizes: impl ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                field_constant_data: impl ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::ConstantDataOffset>]>,
                >,
            ) -> ::planus::Offset<Self> {
                let prepared_version = field_version.prepare(builder);
                let prepared_xnodes = field_xnodes.prepare(builder);
                let prepared_xvalues = field_xvalues.prepare(builder);
                let prepared_num_externs = field_num_externs.prepare(builder, &0);
                let prepared_input_ids = field_input_ids.prepare(builder);
                let prepared_output_ids = field_output_ids.prepare(builder);
                let prepared_constant_buffer = field_constant_buffer.prepare(builder);
                let prepared_mem_buffer_sizes = field_mem_buffer_sizes.prepare(builder);
                let prepared_constant_data = field_constant_data.prepare(builder);

                let mut table_writer: ::planus::table_writer::TableWriter<22> =
                    ::core::default::Default::default();
                if prepared_version.is_some() {
                    table_writer.write_entry::<::planus::Offset<str>>(0);
                }
                if prepared_xnodes.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::XNode>]>>(1);
                }
                if prepared_xvalues.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::XValue>]>>(2);
                }
                if prepared_num_externs.is_some() {
                    table_writer.write_entry::<u32>(3);
                }
                if prepared_input_ids.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u32]>>(4);
                }
                if prepared_output_ids.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u32]>>(5);
                }
                if prepared_constant_buffer.is_some() {
                    table_writer
                        .write_entry::<::planus::Offset<[::planus::Offset<self::Buffer>]>>(6);
                }
                if prepared_mem_buffer_sizes.is_some() {
                    table_writer.write_entry::<::planus::Offset<[u32]>>(7);
                }
                if prepared_constant_data.is_some() {
                    table_writer.write_entry::<::planus::Offset<[::planus::Offset<self::ConstantDataOffset>]>>(8);
                }

                unsafe {
                    table_writer.finish(builder, |object_writer| {
                        if let ::core::option::Option::Some(prepared_version) = prepared_version {
                            object_writer.write::<_, _, 4>(&prepared_version);
                        }
                        if let ::core::option::Option::Some(prepared_xnodes) = prepared_xnodes {
                            object_writer.write::<_, _, 4>(&prepared_xnodes);
                        }
                        if let ::core::option::Option::Some(prepared_xvalues) = prepared_xvalues {
                            object_writer.write::<_, _, 4>(&prepared_xvalues);
                        }
                        if let ::core::option::Option::Some(prepared_num_externs) =
                            prepared_num_externs
                        {
                            object_writer.write::<_, _, 4>(&prepared_num_externs);
                        }
                        if let ::core::option::Option::Some(prepared_input_ids) = prepared_input_ids
                        {
                            object_writer.write::<_, _, 4>(&prepared_input_ids);
                        }
                        if let ::core::option::Option::Some(prepared_output_ids) =
                            prepared_output_ids
                        {
                            object_writer.write::<_, _, 4>(&prepared_output_ids);
                        }
                        if let ::core::option::Option::Some(prepared_constant_buffer) =
                            prepared_constant_buffer
                        {
                            object_writer.write::<_, _, 4>(&prepared_constant_buffer);
                        }
                        if let ::core::option::Option::Some(prepared_mem_buffer_sizes) =
                            prepared_mem_buffer_sizes
                        {
                            object_writer.write::<_, _, 4>(&prepared_mem_buffer_sizes);
                        }
                        if let ::core::option::Option::Some(prepared_constant_data) =
                            prepared_constant_data
                        {
                            object_writer.write::<_, _, 4>(&prepared_constant_data);
                        }
                    });
                }
                builder.current_offset()
            }
        }

        impl ::planus::WriteAs<::planus::Offset<XnnGraph>> for XnnGraph {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnGraph> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl ::planus::WriteAsOptional<::planus::Offset<XnnGraph>> for XnnGraph {
            type Prepared = ::planus::Offset<Self>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnGraph>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl ::planus::WriteAsOffset<XnnGraph> for XnnGraph {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnGraph> {
                XnnGraph::create(
                    builder,
                    &self.version,
                    &self.xnodes,
                    &self.xvalues,
                    self.num_externs,
                    &self.input_ids,
                    &self.output_ids,
                    &self.constant_buffer,
                    &self.mem_buffer_sizes,
                    &self.constant_data,
                )
            }
        }

        /// Builder for serializing an instance of the [XnnGraph] type.
        ///
        /// Can be created using the [XnnGraph::builder] method.
        #[derive(Debug)]
        #[must_use]
        pub struct XnnGraphBuilder<State>(State);

        impl XnnGraphBuilder<()> {
            /// Setter for the [`version` field](XnnGraph#structfield.version).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn version<T0>(self, value: T0) -> XnnGraphBuilder<(T0,)>
            where
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
            {
                XnnGraphBuilder((value,))
            }

            /// Sets the [`version` field](XnnGraph#structfield.version) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn version_as_null(self) -> XnnGraphBuilder<((),)> {
                self.version(())
            }
        }

        impl<T0> XnnGraphBuilder<(T0,)> {
            /// Setter for the [`xnodes` field](XnnGraph#structfield.xnodes).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn xnodes<T1>(self, value: T1) -> XnnGraphBuilder<(T0, T1)>
            where
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::XNode>]>>,
            {
                let (v0,) = self.0;
                XnnGraphBuilder((v0, value))
            }

            /// Sets the [`xnodes` field](XnnGraph#structfield.xnodes) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn xnodes_as_null(self) -> XnnGraphBuilder<(T0, ())> {
                self.xnodes(())
            }
        }

        impl<T0, T1> XnnGraphBuilder<(T0, T1)> {
            /// Setter for the [`xvalues` field](XnnGraph#structfield.xvalues).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn xvalues<T2>(self, value: T2) -> XnnGraphBuilder<(T0, T1, T2)>
            where
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::XValue>]>>,
            {
                let (v0, v1) = self.0;
                XnnGraphBuilder((v0, v1, value))
            }

            /// Sets the [`xvalues` field](XnnGraph#structfield.xvalues) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn xvalues_as_null(self) -> XnnGraphBuilder<(T0, T1, ())> {
                self.xvalues(())
            }
        }

        impl<T0, T1, T2> XnnGraphBuilder<(T0, T1, T2)> {
            /// Setter for the [`num_externs` field](XnnGraph#structfield.num_externs).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_externs<T3>(self, value: T3) -> XnnGraphBuilder<(T0, T1, T2, T3)>
            where
                T3: ::planus::WriteAsDefault<u32, u32>,
            {
                let (v0, v1, v2) = self.0;
                XnnGraphBuilder((v0, v1, v2, value))
            }

            /// Sets the [`num_externs` field](XnnGraph#structfield.num_externs) to the default value.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn num_externs_as_default(
                self,
            ) -> XnnGraphBuilder<(T0, T1, T2, ::planus::DefaultValue)> {
                self.num_externs(::planus::DefaultValue)
            }
        }

        impl<T0, T1, T2, T3> XnnGraphBuilder<(T0, T1, T2, T3)> {
            /// Setter for the [`input_ids` field](XnnGraph#structfield.input_ids).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_ids<T4>(self, value: T4) -> XnnGraphBuilder<(T0, T1, T2, T3, T4)>
            where
                T4: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
            {
                let (v0, v1, v2, v3) = self.0;
                XnnGraphBuilder((v0, v1, v2, v3, value))
            }

            /// Sets the [`input_ids` field](XnnGraph#structfield.input_ids) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn input_ids_as_null(self) -> XnnGraphBuilder<(T0, T1, T2, T3, ())> {
                self.input_ids(())
            }
        }

        impl<T0, T1, T2, T3, T4> XnnGraphBuilder<(T0, T1, T2, T3, T4)> {
            /// Setter for the [`output_ids` field](XnnGraph#structfield.output_ids).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_ids<T5>(self, value: T5) -> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5)>
            where
                T5: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
            {
                let (v0, v1, v2, v3, v4) = self.0;
                XnnGraphBuilder((v0, v1, v2, v3, v4, value))
            }

            /// Sets the [`output_ids` field](XnnGraph#structfield.output_ids) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn output_ids_as_null(self) -> XnnGraphBuilder<(T0, T1, T2, T3, T4, ())> {
                self.output_ids(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5)> {
            /// Setter for the [`constant_buffer` field](XnnGraph#structfield.constant_buffer).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn constant_buffer<T6>(
                self,
                value: T6,
            ) -> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6)>
            where
                T6: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Buffer>]>>,
            {
                let (v0, v1, v2, v3, v4, v5) = self.0;
                XnnGraphBuilder((v0, v1, v2, v3, v4, v5, value))
            }

            /// Sets the [`constant_buffer` field](XnnGraph#structfield.constant_buffer) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn constant_buffer_as_null(self) -> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, ())> {
                self.constant_buffer(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6)> {
            /// Setter for the [`mem_buffer_sizes` field](XnnGraph#structfield.mem_buffer_sizes).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn mem_buffer_sizes<T7>(
                self,
                value: T7,
            ) -> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)>
            where
                T7: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
            {
                let (v0, v1, v2, v3, v4, v5, v6) = self.0;
                XnnGraphBuilder((v0, v1, v2, v3, v4, v5, v6, value))
            }

            /// Sets the [`mem_buffer_sizes` field](XnnGraph#structfield.mem_buffer_sizes) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn mem_buffer_sizes_as_null(
                self,
            ) -> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6, ())> {
                self.mem_buffer_sizes(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6, T7)> {
            /// Setter for the [`constant_data` field](XnnGraph#structfield.constant_data).
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn constant_data<T8>(
                self,
                value: T8,
            ) -> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
            where
                T8: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::ConstantDataOffset>]>,
                >,
            {
                let (v0, v1, v2, v3, v4, v5, v6, v7) = self.0;
                XnnGraphBuilder((v0, v1, v2, v3, v4, v5, v6, v7, value))
            }

            /// Sets the [`constant_data` field](XnnGraph#structfield.constant_data) to null.
            #[inline]
            #[allow(clippy::type_complexity)]
            pub fn constant_data_as_null(
                self,
            ) -> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, ())> {
                self.constant_data(())
            }
        }

        impl<T0, T1, T2, T3, T4, T5, T6, T7, T8> XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)> {
            /// Finish writing the builder to get an [Offset](::planus::Offset) to a serialized [XnnGraph].
            #[inline]
            pub fn finish(self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnGraph>
            where
                Self: ::planus::WriteAsOffset<XnnGraph>,
            {
                ::planus::WriteAsOffset::prepare(&self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::XNode>]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::XValue>]>>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T5: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T6: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Buffer>]>>,
                T7: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T8: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::ConstantDataOffset>]>,
                >,
            > ::planus::WriteAs<::planus::Offset<XnnGraph>>
            for XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
        {
            type Prepared = ::planus::Offset<XnnGraph>;

            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnGraph> {
                ::planus::WriteAsOffset::prepare(self, builder)
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::XNode>]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::XValue>]>>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T5: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T6: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Buffer>]>>,
                T7: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T8: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::ConstantDataOffset>]>,
                >,
            > ::planus::WriteAsOptional<::planus::Offset<XnnGraph>>
            for XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
        {
            type Prepared = ::planus::Offset<XnnGraph>;

            #[inline]
            fn prepare(
                &self,
                builder: &mut ::planus::Builder,
            ) -> ::core::option::Option<::planus::Offset<XnnGraph>> {
                ::core::option::Option::Some(::planus::WriteAsOffset::prepare(self, builder))
            }
        }

        impl<
                T0: ::planus::WriteAsOptional<::planus::Offset<::core::primitive::str>>,
                T1: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::XNode>]>>,
                T2: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::XValue>]>>,
                T3: ::planus::WriteAsDefault<u32, u32>,
                T4: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T5: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T6: ::planus::WriteAsOptional<::planus::Offset<[::planus::Offset<self::Buffer>]>>,
                T7: ::planus::WriteAsOptional<::planus::Offset<[u32]>>,
                T8: ::planus::WriteAsOptional<
                    ::planus::Offset<[::planus::Offset<self::ConstantDataOffset>]>,
                >,
            > ::planus::WriteAsOffset<XnnGraph>
            for XnnGraphBuilder<(T0, T1, T2, T3, T4, T5, T6, T7, T8)>
        {
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> ::planus::Offset<XnnGraph> {
                let (v0, v1, v2, v3, v4, v5, v6, v7, v8) = &self.0;
                XnnGraph::create(builder, v0, v1, v2, v3, v4, v5, v6, v7, v8)
            }
        }

        /// Reference to a deserialized [XnnGraph].
        #[derive(Copy, Clone)]
        pub struct XnnGraphRef<'a>(#[allow(dead_code)] ::planus::table_reader::Table<'a>);

        impl<'a> XnnGraphRef<'a> {
            /// Getter for the [`version` field](XnnGraph#structfield.version).
            #[inline]
            pub fn version(
                &self,
            ) -> ::planus::Result<::core::option::Option<&'a ::core::primitive::str>> {
                self.0.access(0, "XnnGraph", "version")
            }

            /// Getter for the [`xnodes` field](XnnGraph#structfield.xnodes).
            #[inline]
            pub fn xnodes(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<::planus::Vector<'a, ::planus::Result<self::XNodeRef<'a>>>>,
            > {
                self.0.access(1, "XnnGraph", "xnodes")
            }

            /// Getter for the [`xvalues` field](XnnGraph#structfield.xvalues).
            #[inline]
            pub fn xvalues(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<::planus::Vector<'a, ::planus::Result<self::XValueRef<'a>>>>,
            > {
                self.0.access(2, "XnnGraph", "xvalues")
            }

            /// Getter for the [`num_externs` field](XnnGraph#structfield.num_externs).
            #[inline]
            pub fn num_externs(&self) -> ::planus::Result<u32> {
                ::core::result::Result::Ok(
                    self.0.access(3, "XnnGraph", "num_externs")?.unwrap_or(0),
                )
            }

            /// Getter for the [`input_ids` field](XnnGraph#structfield.input_ids).
            #[inline]
            pub fn input_ids(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u32>>> {
                self.0.access(4, "XnnGraph", "input_ids")
            }

            /// Getter for the [`output_ids` field](XnnGraph#structfield.output_ids).
            #[inline]
            pub fn output_ids(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u32>>> {
                self.0.access(5, "XnnGraph", "output_ids")
            }

            /// Getter for the [`constant_buffer` field](XnnGraph#structfield.constant_buffer).
            #[inline]
            pub fn constant_buffer(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<::planus::Vector<'a, ::planus::Result<self::BufferRef<'a>>>>,
            > {
                self.0.access(6, "XnnGraph", "constant_buffer")
            }

            /// Getter for the [`mem_buffer_sizes` field](XnnGraph#structfield.mem_buffer_sizes).
            #[inline]
            pub fn mem_buffer_sizes(
                &self,
            ) -> ::planus::Result<::core::option::Option<::planus::Vector<'a, u32>>> {
                self.0.access(7, "XnnGraph", "mem_buffer_sizes")
            }

            /// Getter for the [`constant_data` field](XnnGraph#structfield.constant_data).
            #[inline]
            pub fn constant_data(
                &self,
            ) -> ::planus::Result<
                ::core::option::Option<
                    ::planus::Vector<'a, ::planus::Result<self::ConstantDataOffsetRef<'a>>>,
                >,
            > {
                self.0.access(8, "XnnGraph", "constant_data")
            }
        }

        impl<'a> ::core::fmt::Debug for XnnGraphRef<'a> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let mut f = f.debug_struct("XnnGraphRef");
                if let ::core::option::Option::Some(field_version) = self.version().transpose() {
                    f.field("version", &field_version);
                }
                if let ::core::option::Option::Some(field_xnodes) = self.xnodes().transpose() {
                    f.field("xnodes", &field_xnodes);
                }
                if let ::core::option::Option::Some(field_xvalues) = self.xvalues().transpose() {
                    f.field("xvalues", &field_xvalues);
                }
                f.field("num_externs", &self.num_externs());
                if let ::core::option::Option::Some(field_input_ids) = self.input_ids().transpose()
                {
                    f.field("input_ids", &field_input_ids);
                }
                if let ::core::option::Option::Some(field_output_ids) =
                    self.output_ids().transpose()
                {
                    f.field("output_ids", &field_output_ids);
                }
                if let ::core::option::Option::Some(field_constant_buffer) =
                    self.constant_buffer().transpose()
                {
                    f.field("constant_buffer", &field_constant_buffer);
                }
                if let ::core::option::Option::Some(field_mem_buffer_sizes) =
                    self.mem_buffer_sizes().transpose()
                {
                    f.field("mem_buffer_sizes", &field_mem_buffer_sizes);
                }
                if let ::core::option::Option::Some(field_constant_data) =
                    self.constant_data().transpose()
                {
                    f.field("constant_data", &field_constant_data);
                }
                f.finish()
            }
        }

        impl<'a> ::core::convert::TryFrom<XnnGraphRef<'a>> for XnnGraph {
            type Error = ::planus::Error;

            #[allow(unreachable_code)]
            fn try_from(value: XnnGraphRef<'a>) -> ::planus::Result<Self> {
                ::core::result::Result::Ok(Self {
                    version: value.version()?.map(::core::convert::Into::into),
                    xnodes: if let ::core::option::Option::Some(xnodes) = value.xnodes()? {
                        ::core::option::Option::Some(xnodes.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    xvalues: if let ::core::option::Option::Some(xvalues) = value.xvalues()? {
                        ::core::option::Option::Some(xvalues.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                    num_externs: ::core::convert::TryInto::try_into(value.num_externs()?)?,
                    input_ids: if let ::core::option::Option::Some(input_ids) = value.input_ids()? {
                        ::core::option::Option::Some(input_ids.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    output_ids: if let ::core::option::Option::Some(output_ids) =
                        value.output_ids()?
                    {
                        ::core::option::Option::Some(output_ids.to_vec()?)
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
                    mem_buffer_sizes: if let ::core::option::Option::Some(mem_buffer_sizes) =
                        value.mem_buffer_sizes()?
                    {
                        ::core::option::Option::Some(mem_buffer_sizes.to_vec()?)
                    } else {
                        ::core::option::Option::None
                    },
                    constant_data: if let ::core::option::Option::Some(constant_data) =
                        value.constant_data()?
                    {
                        ::core::option::Option::Some(constant_data.to_vec_result()?)
                    } else {
                        ::core::option::Option::None
                    },
                })
            }
        }

        impl<'a> ::planus::TableRead<'a> for XnnGraphRef<'a> {
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

        impl<'a> ::planus::VectorReadInner<'a> for XnnGraphRef<'a> {
            type Error = ::planus::Error;
            const STRIDE: usize = 4;

            unsafe fn from_buffer(
                buffer: ::planus::SliceWithStartOffset<'a>,
                offset: usize,
            ) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(buffer, offset).map_err(|error_kind| {
                    error_kind.with_error_location("[XnnGraphRef]", "get", buffer.offset_from_start)
                })
            }
        }

        /// # Safety
        /// The planus compiler generates implementations that initialize
        /// the bytes in `write_values`.
        unsafe impl ::planus::VectorWrite<::planus::Offset<XnnGraph>> for XnnGraph {
            type Value = ::planus::Offset<XnnGraph>;
            const STRIDE: usize = 4;
            #[inline]
            fn prepare(&self, builder: &mut ::planus::Builder) -> Self::Value {
                ::planus::WriteAs::prepare(self, builder)
            }

            #[inline]
            unsafe fn write_values(
                values: &[::planus::Offset<XnnGraph>],
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

        impl<'a> ::planus::ReadAsRoot<'a> for XnnGraphRef<'a> {
            fn read_as_root(slice: &'a [u8]) -> ::planus::Result<Self> {
                ::planus::TableRead::from_buffer(
                    ::planus::SliceWithStartOffset {
                        buffer: slice,
                        offset_from_start: 0,
                    },
                    0,
                )
                .map_err(|error_kind| {
                    error_kind.with_error_location("[XnnGraphRef]", "read_as_root", 0)
                })
            }
        }
    }
}
